"""Chunkwise-parallel causal fast weights in pure PyTorch (the CPU path and the GPU fallback).

The sequence is cut into N chunks of C positions; within a chunk everything is dense matmuls,
across chunks only the state S [E, M] is carried. Derivations: fw_fairseq/ops/README.md.
Autograd keeps one state per chunk, never one per position, so backward memory is
O(N E M + T (E + M + C)) per head instead of O(T E M).

Shapes: q, k [B, H, T, E]; v [B, H, T, M]; beta [B, H, T]; state [B, H, E, M]. T need not be a
multiple of C: the tail is zero-padded (zero k and beta write nothing; zero q reads nothing).
fp16/bf16 inputs are computed and accumulated in float32; the output is cast back to the input
dtype and the state stays float32.
"""
import torch
import torch.nn.functional as F

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def state_dtype(dtype):
    """dtype of the fast weight state (and of the accumulation) for inputs of `dtype`."""
    return torch.float32 if dtype in _HALF_DTYPES else dtype


def _to_chunks(x, chunk_size):
    """[B, H, T, D] -> [B, H, N, C, D], zero-padding T up to N*C (also [B, H, T] -> [B, H, N, C])."""
    T = x.shape[2]
    pad = (-T) % chunk_size
    if pad:
        x = F.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad))
    return x.reshape(*x.shape[:2], -1, chunk_size, *x.shape[3:])


def _from_chunks(x, T):
    """[B, H, N, C, M] -> [B, H, T, M] (drops the padded tail)."""
    return x.reshape(*x.shape[:2], -1, x.shape[-1])[:, :, :T]


def _initial(k, v, initial_state, dtype):
    if initial_state is None:
        return k.new_zeros(k.shape[0], k.shape[1], k.shape[-1], v.shape[-1], dtype=dtype)  # [B, H, E, M]
    return initial_state.to(dtype)


def chunked_sum(q, k, v, initial_state=None, output_final_state=False, chunk_size=64):
    """Causal sum rule, fully parallel over chunks. Returns (o [B, H, T, M], state or None).

    o_chunk = Q S_before + tril(Q K^T) V, where S_before is the exclusive prefix sum of K_n^T V_n.
    """
    out_dtype, T = q.dtype, q.shape[2]
    dtype = state_dtype(out_dtype)
    C = min(chunk_size, T)  # a short sequence (decoding: T = 1) is one small chunk, not padding
    Q, K, V = (_to_chunks(x.to(dtype), C) for x in (q, k, v))  # [B, H, N, C, E|M]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()  # [C, C], s <= t
    scores = (Q @ K.transpose(-1, -2)).masked_fill(~causal, 0.0)  # [B, H, N, C, C]
    o = scores @ V  # [B, H, N, C, M], the intra-chunk part
    if Q.shape[2] == 1 and initial_state is None:
        # One chunk and no past (training on MT-length sentences): no state is needed to read,
        # and an [E, M] state per head costs more than the T x T scores when T < E, M.
        o = _from_chunks(o, T).to(out_dtype)
        return o, ((K[:, :, 0].transpose(-1, -2) @ V[:, :, 0]) if output_final_state else None)
    S0 = _initial(k, v, initial_state, dtype)  # [B, H, E, M]
    kv = K.transpose(-1, -2) @ V  # [B, H, N, E, M], what chunk n writes
    inclusive = kv.cumsum(dim=2)  # [B, H, N, E, M], written by chunks <= n
    # exclusive prefix by shifting (not inclusive - kv, which would cancel catastrophically)
    before = S0[:, :, None] + F.pad(inclusive[:, :, :-1], (0, 0, 0, 0, 1, 0))  # [B, H, N, E, M]
    o = Q @ before + o  # [B, H, N, C, M]
    o = _from_chunks(o, T).to(out_dtype)  # [B, H, T, M]
    return o, (S0 + inclusive[:, :, -1] if output_final_state else None)


def chunked_delta(q, k, v, beta, initial_state=None, output_final_state=False, chunk_size=64):
    """Causal delta rule in the chunkwise WY/UT form (Yang et al., 2024). Returns (o or None, state or None).

    Per chunk, with S the state before it:
        A = I + tril(diag(beta) K K^T, -1);  T = A^{-1} diag(beta);  W = T K;  U = T V
        u = U - W S;  o = Q S + tril(Q K^T) u;  S <- S + K^T u
    A, W, U and tril(Q K^T) depend on no state and are computed for all chunks at once; only the
    state-dependent matmuls ([W; Q] S, tril(Q K^T) u, K^T u) run in the loop over chunks.
    q may be None (a pure write, as in fast_weight_write): then no output is computed and o is None.
    """
    out_dtype, (B, H, T, E) = v.dtype if q is None else q.dtype, k.shape
    dtype = state_dtype(out_dtype)
    C = min(chunk_size, T)
    # batch and heads flattened so the loop can use 3-D baddbmm: [B*H, N, C, D]
    K = _to_chunks(k.to(dtype), C).flatten(0, 1)  # [BH, N, C, E]
    Bt = _to_chunks(beta.to(dtype), C).flatten(0, 1)[..., None]  # [BH, N, C, 1]
    rhs = Bt * torch.cat([K, _to_chunks(v.to(dtype), C).flatten(0, 1)], dim=-1)  # [BH, N, C, E+M] = beta [K V]
    strict = torch.ones(C, C, dtype=torch.bool, device=k.device).tril(-1)  # [C, C], s < t
    A = (rhs[..., :E] @ K.transpose(-1, -2)).masked_fill(~strict, 0.0)  # [BH, N, C, C], tril(diag(beta) K K^T, -1)
    A = A + torch.eye(C, dtype=dtype, device=k.device)
    # [W U] = A^{-1} diag(beta) [K V]: one unit-lower-triangular solve instead of forming T.
    # W only ever multiplies a nonzero state: one chunk with no initial state needs U alone.
    if K.shape[1] == 1 and initial_state is None:
        rhs = rhs[..., E:]
    WU = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)  # [BH, N, C, (E+)M]
    W, U = WU[..., :-v.shape[-1]], WU[..., -v.shape[-1]:]  # W: [BH, N, C, E or 0]
    if q is not None:
        Q = _to_chunks(q.to(dtype), C).flatten(0, 1)  # [BH, N, C, E]
        inclusive = strict | torch.eye(C, dtype=torch.bool, device=k.device)  # [C, C], s <= t
        scores = (Q @ K.transpose(-1, -2)).masked_fill(~inclusive, 0.0)  # [BH, N, C, C]
        if W.shape[-1]:  # (an empty W is never multiplied: see above)
            W = torch.cat([W, Q], dim=-2)  # [BH, N, 2C, E]: W S and Q S in one matmul per chunk
    # S is None while the state is still zero (no initial state): the first chunk skips W S, Q S.
    S = None if initial_state is None else initial_state.to(dtype).flatten(0, 1)  # [BH, E, M]
    # unbind, not X[:, n]: the backward of N index ops would build N full-size zero gradients
    steps = list(zip(W.unbind(1), U.unbind(1), K.unbind(1), *([] if q is None else [scores.unbind(1)])))
    outputs = []
    for n, (W_n, U_n, K_n, *scores_n) in enumerate(steps):  # [BH, C or 2C, E], [BH, C, M], [BH, C, E], [BH, C, C]
        WS = None if S is None else W_n @ S  # [BH, C or 2C, M]
        u = U_n if WS is None else U_n - WS[:, :C]  # [BH, C, M], the effective per-position writes
        if q is not None:  # [BH, C, M] = Q S + tril(Q K^T) u
            outputs.append(scores_n[0] @ u if WS is None else torch.baddbmm(WS[:, C:], scores_n[0], u))
        if n + 1 < len(steps) or output_final_state:
            S = K_n.transpose(-1, -2) @ u if S is None else torch.baddbmm(S, K_n.transpose(-1, -2), u)
    if not output_final_state:
        S = None
    elif S is None:  # nothing was written and no initial state: still return the zero state
        S = _initial(k, v, None, dtype).flatten(0, 1)
    S = None if S is None else S.unflatten(0, (B, H))  # [B, H, E, M]
    if q is None:
        return None, S
    o = torch.stack(outputs, dim=1).unflatten(0, (B, H))  # [B, H, N, C, M]
    return _from_chunks(o, T).to(out_dtype), S


def _add_outer(S0, k, u):
    """S0 + k^T u over [B, H] in one fused baddbmm (no temporary [B, H, E, M] outer product).

    S0 [B, H, E, M] or None; k [B, H, 1, E]; u [B, H, 1, M] -> [B, H, E, M]."""
    B, H, _, E = k.shape
    kt, ut = k.reshape(B * H, 1, E).transpose(1, 2), u.reshape(B * H, 1, -1)  # [BH, E, 1], [BH, 1, M]
    if S0 is None:
        return (kt @ ut).view(B, H, E, -1)
    return torch.baddbmm(S0.reshape(B * H, E, -1), kt, ut).view(B, H, E, -1)


def step_sum(q, k, v, initial_state=None, output_final_state=False):
    """T = 1 (a decoding step): S + k v^T, o = q S, without the chunk machinery's small-op overhead.

    q, k [B, H, 1, E]; v [B, H, 1, M]; state [B, H, E, M]. Same function as chunked_sum at T = 1.
    """
    out_dtype, dtype = q.dtype, state_dtype(q.dtype)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    S0 = None if initial_state is None else initial_state.to(dtype)
    S = _add_outer(S0, k, v)  # [B, H, E, M]
    return (q @ S).to(out_dtype), (S if output_final_state else None)


def step_delta(q, k, v, beta, initial_state=None, output_final_state=False):
    """T = 1 delta rule: u = beta (v - k S), S + k^T u, o = q S. Same function as chunked_delta at T = 1."""
    out_dtype, dtype = q.dtype, state_dtype(q.dtype)
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    S0 = None if initial_state is None else initial_state.to(dtype)
    u = v if S0 is None else v - k @ S0  # [B, H, 1, M]: v - W_{t-1}^T k
    S = _add_outer(S0, k, beta[..., None] * u)  # [B, H, E, M]
    return (q @ S).to(out_dtype), (S if output_final_state else None)
