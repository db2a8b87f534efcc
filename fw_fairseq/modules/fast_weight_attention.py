"""FastWeightAttention: a drop-in for fairseq's MultiheadAttention built on fw_fairseq.ops.

One module serves the three places of a Transformer:
- encoder self-attention (non-causal): every position reads the memory written by all positions;
- decoder self-attention (causal): position t reads W_t, the memory after writes 1..t;
- encoder-decoder attention (non-causal): decoder queries read the memory written by the source,
  which is built once per sentence and cached in `incremental_state` during generation.

Update rules (DESIGN.md §1):
- sum:   W += phi(k) v^T, y = W^T phi(q) / (z . phi(q) + eps). The denominator rides along as an
         extra value column of ones, so z lives in the state's last column ([B, H, E, D+1]) and the
         ops never see a normalisation.
- delta: phi' = phi / sum(phi) for keys and queries, beta = sigmoid(w_beta^T x) per head, and the
         delta-rule ops; no denominator.
Padding: phi(k) and beta are zeroed at padded positions after the feature map (phi(0) != 0).
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.incremental_decoding_utils import with_incremental_state

from fw_fairseq.modules.fast_weight_config import FastWeightConfig
from fw_fairseq.ops import (FavorPlus, dpfp, elu_plus_one, fast_weight_attend, fast_weight_delta,
                            fast_weight_read, fast_weight_sum, fast_weight_write, sum_normalize)

# Added to z . phi(q) so a query whose features miss every key (DPFP is sparse) reads zero.
DENOMINATOR_EPS = 1e-6


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
        self.beam_size = 1  # set by fairseq's generator (set_beam_size)
        self.feature_map = config.feature_map
        self.update_rule = config.update_rule

        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(self.kdim, embed_dim)
        self.v_proj = nn.Linear(self.vdim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        # beta is the write strength of each written position, so it reads the key-side input.
        self.beta_proj = nn.Linear(self.kdim, num_heads) if self.update_rule == "delta" else None

        if self.feature_map == "dpfp":
            max_nu = 2 * self.head_dim - 1
            if not 1 <= config.dpfp_nu <= max_nu:
                raise ValueError(f"--fw-dpfp-nu got {config.dpfp_nu}; allowed: 1..{max_nu} "
                                 f"(2*d_key-1 with d_key={self.head_dim})")
            self.dpfp_nu = config.dpfp_nu
        self.favor = (FavorPlus(self.head_dim, config.favor_features)
                      if self.feature_map == "favor" else None)
        self.reset_parameters()

    def reset_parameters(self):
        # fairseq MultiheadAttention's initialisation, so `--fw-attention none` vs fast weights
        # compares attention types and not initialisations.
        gain = 2 ** -0.5 if self.kdim == self.vdim == self.embed_dim else 1.0
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=gain)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    # ---------------------------------------------------------------- pieces

    def _split_heads(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        length, bsz, _ = x.shape
        # [T, B, C] -> [T, B, H, D] -> [B, H, T, D]
        return x.view(length, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3).to(dtype)

    def _phi(self, x: Tensor, is_query: bool) -> Tensor:
        """[B, H, T, D] -> [B, H, T, E] (sum-normalised under the delta rule)."""
        if self.feature_map == "elu":
            phi = elu_plus_one(x)
        elif self.feature_map == "dpfp":
            phi = dpfp(x, self.dpfp_nu)
        else:
            phi = self.favor(x, is_query=is_query)
        return sum_normalize(phi) if self.update_rule == "delta" else phi

    def _project_writes(self, x: Tensor) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """Projections of the written positions `x` [S, B, C]; they run under autocast."""
        beta_logits = self.beta_proj(x) if self.beta_proj is not None else None
        return self.k_proj(x), self.v_proj(x), beta_logits

    def _writes(self, k: Tensor, v: Tensor, beta_logits: Optional[Tensor],
                key_padding_mask: Optional[Tensor], dtype: torch.dtype
                ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """What each position writes: phi(k) [B,H,S,E], values [B,H,S,D(+1)], beta [B,H,S]."""
        phi_k = self._phi(self._split_heads(k, dtype), is_query=False)
        v = self._split_heads(v, dtype)  # [B, H, S, D]
        beta = None
        if beta_logits is not None:
            beta = torch.sigmoid(beta_logits.to(dtype)).permute(1, 2, 0)  # [S, B, H] -> [B, H, S]
        else:
            v = torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], dim=-1)  # [B, H, S, D+1]
        if key_padding_mask is not None:
            keep = (~key_padding_mask.bool()).to(dtype)  # [B, S]
            phi_k = phi_k * keep[:, None, :, None]
            if beta is not None:
                beta = beta * keep[:, None, :]
        return phi_k, v, beta

    def _merge(self, o: Tensor) -> Tensor:
        """[B, H, T, D(+1)] read-out -> [T, B, C] after the sum rule's denominator."""
        if self.update_rule == "sum":
            o = o[..., :-1] / (o[..., -1:] + DENOMINATOR_EPS)  # y = W^T phi(q) / (z . phi(q) + eps)
        bsz, _, length, _ = o.shape
        return o.permute(2, 0, 1, 3).reshape(length, bsz, self.embed_dim)  # [T, B, C]

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
        if self.training and self.favor is not None:
            self.favor.redraw()  # once per forward, shared by this layer's queries and keys
        q = self.q_proj(query)
        buffer = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        cached = self.encoder_decoder_attention and buffer is not None  # generation: keep the memory
        memory = buffer.get("memory") if cached else None
        if memory is None:
            beam = self._source_beam(key, key_padding_mask) if cached else 1
            if beam > 1:  # a sentence's beams share its source: write it once
                key = key[:, ::beam]  # [S, B / beam, C]
                if key_padding_mask is not None:
                    key_padding_mask = key_padding_mask[::beam]
            writes = self._project_writes(key)
        # Feature maps, update rule and state in fp32 under --fp16/--amp/autocast (FAVOR+'s exp
        # overflows fp16 and the state sums many steps); the projections above keep autocast.
        dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        with torch.autocast(device_type=query.device.type, enabled=False):
            phi_q = self._phi(self._split_heads(q, dtype), is_query=True)
            if cached:
                if memory is None:  # the source is fixed: build its memory once per sentence
                    memory = fast_weight_write(*self._writes(*writes, key_padding_mask, dtype))
                    buffer["memory"] = memory  # [B / beam, H, E, D(+1)]
                    # hypothesis -> its row of the memory: [0]*beam + [1]*beam + ...
                    buffer["memory_rows"] = torch.arange(
                        memory.size(0), device=memory.device).repeat_interleave(beam)
                    self._set_input_buffer(incremental_state, buffer)
                o = self._read_per_sentence(phi_q, memory)
            elif not self.causal:
                # encoder self- and teacher-forced cross-attention: nothing to keep, so the ops
                # may pick (q k^T) v for short sequences
                o = fast_weight_attend(phi_q, *self._writes(*writes, key_padding_mask, dtype))
            else:
                o = self._causal(phi_q, self._writes(*writes, key_padding_mask, dtype),
                                 buffer, incremental_state)
            o = self._merge(o)
        return self.out_proj(o.to(q.dtype)), None

    def _causal(self, phi_q: Tensor, writes, buffer, incremental_state) -> Tensor:
        """Decoder self-attention: position t reads W_t; generation carries (W, z) in the buffer."""
        phi_k, v, beta = writes
        state = buffer.get("state") if buffer is not None else None
        keep_state = buffer is not None
        if self.update_rule == "sum":
            o, state = fast_weight_sum(phi_q, phi_k, v, state, output_final_state=keep_state)
        else:
            o, state = fast_weight_delta(phi_q, phi_k, v, beta, state, output_final_state=keep_state)
        if buffer is not None:
            buffer["state"] = state  # [B, H, E, D(+1)]: fixed size, whatever the output length
            self._set_input_buffer(incremental_state, buffer)
        return o

    # ------------------------------------------------------------ beam search

    def set_beam_size(self, beam_size: int):
        """fairseq's generator lays out hypotheses as [sentence, beam] on the batch dim; the
        source memory is the same for a sentence's beams, so it is kept once per sentence."""
        self.beam_size = beam_size

    def _source_beam(self, key: Tensor, key_padding_mask: Optional[Tensor]) -> int:
        """The announced beam size if the source rows [S, B, C] really repeat in groups of it,
        else 1. fairseq announces only sizes above 1, so after a beam-4 generator a beam-1 one
        (fairseq's hub interface) still finds 4 here: sharing must not rest on the claim."""
        beam = self.beam_size
        if beam == 1 or key.size(1) % beam:
            return 1
        grouped = key.reshape(key.size(0), -1, beam, key.size(2))  # [S, B / beam, beam, C]
        same = torch.equal(grouped, grouped[:, :, :1].expand_as(grouped))
        if same and key_padding_mask is not None:
            masks = key_padding_mask.reshape(-1, beam, key_padding_mask.size(1))
            same = torch.equal(masks, masks[:, :1].expand_as(masks))
        return beam if same else 1

    def _read_per_sentence(self, phi_q: Tensor, memory: Tensor) -> Tensor:
        """Every hypothesis reads its sentence's memory: phi_q [B, H, T, E] -> [B, H, T, D(+1)]."""
        sentences, beam = memory.shape[0], phi_q.shape[0] // memory.shape[0]
        if beam == 1:
            return fast_weight_read(phi_q, memory)
        bsz, heads, length, width = phi_q.shape
        # [B, H, T, E] -> [B/beam, beam, H, T, E] -> [B/beam, H, beam*T, E]: one read per sentence
        q = phi_q.view(sentences, beam, heads, length, width).transpose(1, 2)
        o = fast_weight_read(q.reshape(sentences, heads, beam * length, width), memory)
        o = o.view(sentences, heads, beam, length, -1).transpose(1, 2)  # [B/beam, beam, H, T, D]
        return o.reshape(bsz, heads, length, -1)

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]],
                                  new_order: Tensor):
        """Beam search reorders (and prunes) hypotheses: batch is dim 0 of every cached tensor.

        The source memory keeps one row per group of hypotheses that read the same row (a
        sentence's beams); it is copied only when such groups leave or split.
        """
        buffer = self._get_input_buffer(incremental_state)
        if not buffer:
            return
        memory, rows = buffer.get("memory"), buffer.get("memory_rows")
        for name, tensor in buffer.items():
            if tensor is not None and name != "memory":
                buffer[name] = tensor.index_select(0, new_order)
        if memory is not None and rows is not None:
            beam = rows.numel() // memory.size(0)  # hypotheses per memory row before reordering
            buffer["memory"], buffer["memory_rows"] = self._regroup(memory, buffer["memory_rows"],
                                                                    beam)
        self._set_input_buffer(incremental_state, buffer)

    @staticmethod
    def _regroup(memory: Tensor, rows: Tensor, beam: int) -> Tuple[Tensor, Tensor]:
        """memory [M, H, E, D] and the reordered hypothesis -> row map `rows` [B] -> a memory
        whose row i serves hypotheses i*beam .. (i+1)*beam-1, and its row map."""
        if rows.numel() % beam == 0:
            groups = rows.view(-1, beam)  # [B / beam, beam]
            if torch.equal(groups, groups[:, :1].expand_as(groups)):
                heads = groups[:, 0]
                if not torch.equal(heads, torch.arange(memory.size(0), device=heads.device)):
                    memory = memory.index_select(0, heads)  # sentences left (or moved)
                return memory, torch.arange(heads.numel(), device=rows.device).repeat_interleave(beam)
        # the groups split: every hypothesis gets its own copy of its row
        return memory.index_select(0, rows), torch.arange(rows.numel(), device=rows.device)

    def _get_input_buffer(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        result = self.get_incremental_state(incremental_state, "fw_state")
        return result if result is not None else {}

    def _set_input_buffer(self, incremental_state, buffer: Dict[str, Optional[Tensor]]):
        return self.set_incremental_state(incremental_state, "fw_state", buffer)
