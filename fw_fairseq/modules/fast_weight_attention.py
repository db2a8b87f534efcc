"""FastWeightAttention: a drop-in for fairseq's MultiheadAttention built on fw_fairseq.ops.

One module serves the three places of a Transformer; which one is fixed at construction:
- encoder self-attention (non-causal): every position reads the memory written by all positions;
- decoder self-attention (causal): position t reads W_t, the memory after writes 1..t;
- encoder-decoder attention (non-causal): decoder queries read the memory written by the source,
  which is built once per sentence and cached in `incremental_state` during generation; with --fw-cross-align its
  features carry the target and source positions (cross_align.py).

What the attention computes comes from two places of fw_fairseq.ops, never decided here:
- the feature map phi, one FeatureMap object built by the ops' factory from the flags;
- the update rule's record (ops.RULES) of this block (--fw-{place}-rule, else --fw-update-rule): its
  causal op, whether phi is normalised (sum or L2 by --fw-delta-norm, ops.PHI_NORMS), whether the
  values carry the z column (y = W^T phi(q) / (z . phi(q) + eps)), and its per-position scalars.
  This module learns each scalar from the key-side input x_t, per head:
    beta_t  = beta_max * sigmoid(w_beta^T x_t + b)    (write strength; --fw-delta-beta-max)
    alpha_t = sigmoid(w_alpha^T x_t + b), b starting at GATE_BIAS_INIT  (decay of the gated rule)
Padding: a padded position's value row (with the z column) is zeroed, and each scalar takes the
record's pad value there (beta = 0, alpha = 1): it writes nothing and decays nothing.
The map and the record travel together as the block's `Block` (fw_fairseq/decoding/block.py), which forms phi and the
values as the rule writes them; incremental decoding (incremental_state) is fw_fairseq/decoding's (steps.py).
"""
from contextlib import nullcontext
from typing import Dict, NamedTuple, Optional, Tuple

import torch
from torch import Tensor, nn

from fairseq.incremental_decoding_utils import with_incremental_state

from fw_fairseq.modules.fast_weight_config import FastWeightConfig
from fw_fairseq.modules.flag_table import GATE_BIAS_INIT
from fw_fairseq.modules.cross_align import aligned_read, aligned_step
from fw_fairseq.modules.value_conv import DecoderConv, EncoderConv
from fw_fairseq.modules.output_gate import OutputGate
from fw_fairseq.decoding.block import Block
from fw_fairseq.decoding.buffer_order import reorder_buffer
from fw_fairseq.decoding.source_memory import source_beam
from fw_fairseq.decoding.steps import self_attention_step, source_step
from fw_fairseq.ops import RULES, feature_map
from fw_fairseq.ops.common.guards import state_dtype
from fw_fairseq.ops.fused_read.dispatch import takes as fused_read_takes
from fw_fairseq.ops.rules.raw_read import short_read

ENCODER, CAUSAL, CROSS = "encoder", "causal", "cross"  # the three paths
PLACE = {ENCODER: "encoder", CAUSAL: "decoder", CROSS: "cross"}  # a path's name in the --fw-* flags
_NO_CONTEXT = nullcontext()  # reusable: no object made per call


class Projected(NamedTuple):
    """The written positions' projections, computed under the caller's autocast."""
    k: Tensor  # [S, B, C]
    v: Tensor  # [S, B, C]
    scalar_logits: Tuple[Tensor, ...]  # one [S, B, H] per scalar of the rule, in its order


class Writes(NamedTuple):
    """What the written positions put into the memory, head-first: raw keys and values in the heads' dtype, scalars in
    the compute dtype."""
    keys: Tensor  # [B, H, S, D]
    v: Tensor  # [B, H, S, D], 0 at padded positions
    scalars: Tuple[Tensor, ...]  # one [B, H, S] per scalar of the rule, in its ops' argument order


def _without_autocast(device_type: str):
    """A context that switches autocast off where it is on; nothing where it is off (generation's usual case:
    entering and leaving an autocast context costs a decoding step's attention call several microseconds)."""
    return torch.autocast(device_type=device_type, enabled=False) if torch.is_autocast_enabled(device_type) else _NO_CONTEXT


@with_incremental_state
class FastWeightAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, config: FastWeightConfig, causal: bool,
                 kdim: Optional[int] = None, vdim: Optional[int] = None,
                 encoder_decoder_attention: bool = False):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.kdim = kdim or embed_dim
        self.vdim = vdim or embed_dim
        self.causal = causal
        self.encoder_decoder_attention = encoder_decoder_attention
        self.path = CROSS if encoder_decoder_attention else CAUSAL if causal else ENCODER
        self.beam_size = 1  # set by fairseq's generator (set_beam_size)
        self.feature_map = config.feature_map
        self.update_rule = config.rule(PLACE[self.path])  # --fw-{place}-rule or --fw-update-rule
        self.rule = RULES[self.update_rule]
        self.beta_max = config.beta_max
        self.beta_bias = config.beta_bias
        self.delta_norm = config.delta_norm  # the normalisation of phi where the rule has one
        self.cross_align = config.cross_align if self.path == CROSS else 0  # --fw-cross-align
        self.align_ratio = float(config.align_ratio)  # --fw-align-ratio (a number once the model is built)
        self.align_free_heads = config.align_free_heads  # --fw-align-free-heads: the last heads read without it

        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(self.kdim, embed_dim)
        self.v_proj = nn.Linear(self.vdim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        gate = config.gate(PLACE[self.path])  # --fw-output-gate
        self.output_gate = OutputGate(gate, embed_dim, num_heads) if gate != "none" else None
        conv = config.encoder_conv if self.path == ENCODER else 0  # --fw-encoder-conv
        self.encoder_conv = EncoderConv(embed_dim, conv) if conv else None
        conv = config.decoder_conv if self.path == CAUSAL else 0  # --fw-decoder-conv
        self.decoder_conv = DecoderConv(embed_dim, conv) if conv else None
        # Each scalar (beta, alpha) belongs to a written position, so it reads the key-side input;
        # `beta_proj` / `alpha_proj` by name, the checkpoints' parameter names.
        for name in self.rule.scalars:
            self.add_module(f"{name}_proj", nn.Linear(self.kdim, num_heads))
        # Registered under its flag's name: FAVOR+'s R keeps the state-dict key `favor.projection`
        # that checkpoints, --store-ema and fw_research.wmt14.average_checkpoints know.
        # The learned maps' (T2R, trainable Hedgehog) per-head parameters live here too: `t2r.linear.weight`.
        self.add_module(self.feature_map, feature_map(
            self.feature_map, self.head_dim, nu=config.dpfp_nu, m=config.favor_features,
            fixed=not config.redraws_features, heads=num_heads, t2r_features=config.t2r_features,
            trainable=config.hedgehog_trainable))
        self.block = Block.of(self.rule, self.phi, self.delta_norm)  # a plain attribute: phi stays registered once
        self.reset_parameters()

    @property
    def phi(self):
        """The FeatureMap: [..., head_dim] -> [..., E]."""
        return getattr(self, self.feature_map)

    def reset_parameters(self):
        # fairseq MultiheadAttention's initialisation, so `--fw-attention none` vs fast weights
        # compares attention types and not initialisations.
        gain = 2 ** -0.5 if self.kdim == self.vdim == self.embed_dim else 1.0
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=gain)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)
        if "beta" in self.rule.scalars:
            nn.init.constant_(self.beta_proj.bias, self.beta_bias)  # --fw-beta-bias
        if "alpha" in self.rule.scalars:
            # alpha starts near 1 (sigmoid(5) = 0.993): training starts near the delta rule
            nn.init.constant_(self.alpha_proj.bias, GATE_BIAS_INIT)

    # ---------------------------------------------------------------- pieces

    def _heads(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        length, bsz, _ = x.shape
        # [T, B, C] -> [T, B, H, D] -> [B, H, T, D]; a step's [1, B, C] is [B, H, 1, D] in memory: one op, one view
        x = x.view(bsz, self.num_heads, 1, self.head_dim) if length == 1 else x.view(
            length, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
        return x if x.dtype == dtype else x.to(dtype)

    def _project(self, x: Tensor) -> Projected:
        """Projections of the written positions x [S, B, C]."""
        logits = tuple(getattr(self, f"{name}_proj")(x) for name in self.rule.scalars)
        return Projected(self.k_proj(x), self.v_proj(x), logits)

    def _writes(self, projected: Projected, key_padding_mask: Optional[Tensor], dtype: torch.dtype,
                heads: torch.dtype) -> Writes:
        """The written positions' raw keys and values (in `heads`) and scalars (in dtype), head-first."""
        keys = self._heads(projected.k, heads)  # [B, H, S, D]
        v = self._heads(projected.v, heads)  # [B, H, S, D]
        # [S, B, H] -> [B, H, S]; a scale of 1 (the usual beta_max, alpha) skips an op a decoding step pays for
        scalars = [torch.sigmoid(logits if logits.dtype == dtype else logits.to(dtype)).permute(1, 2, 0)
                   for logits in projected.scalar_logits]
        if self.beta_max != 1:
            scalars = [self.beta_max * x if name == "beta" else x for name, x in zip(self.rule.scalars, scalars)]
        if key_padding_mask is not None:
            # A padded position writes nothing when its value row (and z entry, Block.values) is zero and
            # its scalars take the rule's pad values (beta = 0: no delta write, which would otherwise
            # subtract what its key reads). Its phi(k) may stay: phi(0) != 0 is then multiplied by 0,
            # and the value rows (M + 1 wide) are cheaper to mask than phi(k) (E wide).
            pad = key_padding_mask.bool()[:, None, :]  # [B, 1, S]
            v = v.masked_fill(pad[..., None], 0.0)
            scalars = [x.masked_fill(pad, self.rule.pad_values[name])
                       for name, x in zip(self.rule.scalars, scalars)]
        return Writes(keys, v, tuple(scalars))

    def _attend(self, q_heads: Tensor, writes: Writes, key_padding_mask: Optional[Tensor],
                dtype: torch.dtype) -> Tensor:
        """Training and validation (nothing kept): the read [B, H, T, D] from the raw heads in one op where a kernel
        takes the block (rules/raw_read.short_read: the fused GPU read, the CPU kernels), else phi formed in `dtype` and
        the rule run, the same function."""
        causal = self.path == CAUSAL
        o = short_read(self.phi, self.rule, q_heads, writes.keys, writes.v, writes.scalars, key_padding_mask, causal,
                       self.block.norm)
        if o is not None:
            return o
        # half heads kept for the fused read that did not take the block: every other path in dtype
        q_heads, keys, v = (x if x.dtype == dtype else x.to(dtype) for x in (q_heads, writes.keys, writes.v))
        phi_q, phi_k = self.block.features(q_heads, is_query=True), self.block.features(keys, is_query=False)
        v = self.block.values(v, key_padding_mask)  # [B, H, S, D (+ 1)]
        if causal:
            o = self.rule.causal(phi_q, phi_k, v, *writes.scalars)[0]
        else:  # encoder self- and teacher-forced cross-attention: the ops may pick (q k^T) v for short sequences
            o = self.rule.attend(phi_q, phi_k, v, *writes.scalars)
        return self.block.read_out(o)

    def _merge(self, o: Tensor, dtype: torch.dtype) -> Tensor:
        """[B, H, T, D] read-out -> [T, B, C] of dtype."""
        bsz, _, length, _ = o.shape
        # a decoding step's [B, H, 1, D] is [1, B, C] in memory
        o = (o if length == 1 else o.permute(2, 0, 1, 3)).reshape(length, bsz, self.embed_dim)
        return o if o.dtype == dtype else o.to(dtype)

    # ---------------------------------------------------------------- fairseq interface

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False,
                attn_mask: Optional[Tensor] = None, before_softmax: bool = False,
                need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """query [T, B, C], key/value [S, B, C] -> ([T, B, C], None).

        Fast weights have no attention matrix, so no weights are returned even when asked for:
        fairseq's decoder asks for them at its alignment layer on every call and copes with None
        (`--print-alignment` needs softmax cross-attention: leave 'cross' out of --fw-attention).
        A causal block ignores `attn_mask` (fairseq's future mask): it is causal by construction.
        """
        if before_softmax:
            raise ValueError("fast-weight attention has no pre-softmax scores (before_softmax=True)")
        if attn_mask is not None and not self.causal:
            raise ValueError("fast-weight attention cannot honour a custom attn_mask in "
                             "non-causal attention")
        if key is not None and value is not None and key is not value:
            raise ValueError("FastWeightAttention expects key and value to be the same tensor")
        if self.training:
            self.phi.redraw()  # once per forward, shared by this layer's queries and keys
        buffer = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        cached = self.path == CROSS and buffer is not None  # generation: keep the source memory
        beam, memory = 1, buffer.get("memory") if cached else None
        if cached and memory is None:
            beam = source_beam(key, key_padding_mask, self.beam_size)
            if beam > 1:  # a sentence's beams share its source: write it once
                key = key[:, ::beam]  # [S, B / beam, C]
                if key_padding_mask is not None:
                    key_padding_mask = key_padding_mask[::beam]
        q = self.q_proj(query)
        projected = self._project(key) if memory is None else None
        # Feature maps, update rule and state in fp32 under --fp16/--amp/autocast (FAVOR+'s exp
        # overflows fp16 and the state sums many steps); the projections above keep autocast.
        dtype = state_dtype(q.dtype)
        # the fused GPU read takes half heads as they are (it forms phi and computes in fp32 on chip)
        heads = q.dtype if buffer is None and fused_read_takes(q) else dtype
        with _without_autocast(query.device.type):
            q_heads = self._heads(q, heads)  # [B, H, T, D]
            writes = self._writes(projected, key_padding_mask, dtype, heads) if projected is not None else None
            if self.cross_align and cached:
                source = None if writes is None else (writes.keys.to(dtype), writes.v.to(dtype), writes.scalars)
                o = aligned_step(buffer, self.block, self.cross_align, self.align_ratio, q_heads.to(dtype), source,
                                 key_padding_mask, beam, self.align_free_heads)
            elif self.cross_align:
                o = aligned_read(self.block, self.cross_align, self.align_ratio, q_heads, writes.keys, writes.v,
                                 writes.scalars, key_padding_mask, dtype, self.align_free_heads)
            elif cached:  # the source is written once, at the first step (writes None after it)
                o = source_step(buffer, self.block, q_heads, writes, key_padding_mask, beam)
            elif buffer is not None and self.path == CAUSAL:
                o = self_attention_step(buffer, self.block, q_heads, *writes, key_padding_mask)
            else:
                o = self._attend(q_heads, writes, key_padding_mask, dtype)
            o = self._merge(o, q.dtype)  # [T, B, C]
        if self.encoder_conv is not None:  # only on the encoder path, where query, key and value are one x
            o = o + self.encoder_conv(projected.v, key_padding_mask)
        elif self.decoder_conv is not None:  # only on the causal path, likewise
            o = o + (self.decoder_conv(projected.v, key_padding_mask) if buffer is None
                     else self.decoder_conv.step(buffer, projected.v, key_padding_mask))
        return self.out_proj(o if self.output_gate is None else self.output_gate(query, o)), None

    # ------------------------------------------------------------ beam search

    def set_beam_size(self, beam_size: int):
        """fairseq's generator lays out hypotheses as [sentence, beam] on the batch dim; the
        source memory is the same for a sentence's beams, so it is kept once per sentence."""
        self.beam_size = beam_size

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]],
                                  new_order: Tensor):
        """Beam search reorders (and prunes) hypotheses: batch is dim 0 of every cached tensor
        (buffer_order.reorder_buffer)."""
        buffer = self._get_input_buffer(incremental_state)
        if buffer:
            reorder_buffer(buffer, new_order)

    def _get_input_buffer(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        """This layer's buffer, a new one kept in incremental_state at the first call: steps update the dict itself."""
        result = self.get_incremental_state(incremental_state, "fw_state")
        if result is None:
            result = {}
            self.set_incremental_state(incremental_state, "fw_state", result)
        return result
