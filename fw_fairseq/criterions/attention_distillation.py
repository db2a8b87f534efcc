"""`--criterion fw_attention_distillation`: Hedgehog's first stage (Zhang et al. 2024) for a converted model.

Each fast-weight block is trained to attend as the softmax teacher did, on the fly in the same forward, from the
block's own inputs. The teacher's q and k are the teacher's projections: the block's own where they stay frozen
(`--distil-trains maps`), else those of the converted checkpoint `--distil-teacher` (fw_research.convert.convert_softmax
--to), read once, so that a resumed distillation keeps the same teacher.

A sum-rule block matches the teacher's attention weights:

    teacher  A = softmax(q k^T / sqrt(d))                      padded keys masked, causal in decoder self-attention
    student  A' = phi(q) phi(k)^T w / (sum_s phi(q) phi(k_s)^T w + Z_EPS)   the same masks: the read's weights

(w: the aligned cross-attention's prior cos^2P((a_i - b_j) / 2) where --fw-cross-align P is on, free heads 1; else
1), by KL(A || A') = sum A (log A - log A'), summed over the blocks, heads and query rows (the padded queries of
encoder self-attention left out). KL is the soft cross-entropy -sum A log A' less the teacher's entropy, which does
not depend on the student: the same gradients, and 0 where A' = A.

A delta-rule block (delta, gated_delta) has no attention distribution to match: its weights over the written values,
tril(phi(Q) phi(K)^T) T_beta, are signed and its rows do not sum to 1 (ops/README.md §2). Its read is matched instead:
the block's read o [B, H, T, D] (before the output projection; beta and alpha included) against the teacher's
A v, by the squared error per row, mean over the head's D channels, summed like the KL. Matching weights alone does
not make a delta read retrieve what softmax retrieves: the same scores write and erase.

What trains: the feature maps' parameters (`maps`), and with `--distil-trains projections` also each block's q, k,
beta and alpha projections: a map without parameters (dpfp, elu, favor, fixed hedgehog) distils through those. The
first forward freezes every other parameter (fairseq's optimizer skips parameters without gradients, so they stay
as converted); a model with nothing to train is refused in one line. `loss` is logged per scored row of a block and
head, `kl` and `read_mse` per row of their own blocks.
"""
import inspect
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from fairseq import checkpoint_utils, metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from fw_fairseq.modules.cross_align import aligned_angles, aligned_read, align_factors, free_head_factors
from fw_fairseq.modules.fast_weight_attention import CAUSAL, CROSS, ENCODER, FastWeightAttention
from fw_fairseq.modules.fast_weight_flags import cli_error
from fw_fairseq.ops.common.positions import position_weight
from fw_fairseq.ops.common.z_column import Z_EPS

NAME = "fw_attention_distillation"
TRAINS = ("maps", "projections")
PROJECTIONS = ("q_proj", "k_proj")  # the teacher's, read from --distil-teacher with `projections`


def reads_values(attn) -> bool:
    """A delta-rule block (its writes carry beta): its read, not its weights, is matched."""
    return "beta" in attn.rule.scalars


def masks(attn, key_padding_mask, bsz, heads, length, src_len, device):
    """(keep [B, 1, T, S]: the keys each query may weigh, rows [B, H, T]: the query rows scored)."""
    keep = torch.ones(bsz, 1, length, src_len, dtype=torch.bool, device=device)
    if key_padding_mask is not None:
        keep = keep & ~key_padding_mask.bool()[:, None, None, :]
    if attn.path == CAUSAL:
        keep = keep & torch.ones(length, src_len, dtype=torch.bool, device=device).tril()
    rows = keep.any(-1).expand(bsz, heads, length)
    if attn.path == ENCODER and key_padding_mask is not None:  # a padded query's row is no position
        rows = rows & ~key_padding_mask.bool()[:, None, :]
    return keep, rows


def aligned_prior(attn, key_padding_mask, bsz, length, src_len, device):
    """The aligned cross-attention's w(i, j) [B, 1 or H, T, S] (float32), the free heads' 1; None where it is off."""
    if not (attn.path == CROSS and attn.cross_align):
        return None
    target = torch.arange(length, device=device, dtype=torch.float64).expand(bsz, -1)  # [B, T]
    angles = aligned_angles(key_padding_mask, bsz, src_len, target, attn.align_ratio)  # [B, T], [B, S]
    factors = [free_head_factors(align_factors(angle, attn.cross_align), attn.num_heads, attn.align_free_heads)
               for angle in angles]  # [B, (H,) T | S, R]
    return position_weight(*factors).float()


def teacher_heads(attn, query, key, teacher):
    """The teacher's q [B, H, T, D] and k [B, H, S, D] in float32, no graph: from `teacher` ({"q_proj": (weight,
    bias), "k_proj": ...}) where given, else the block's own (frozen) projections."""
    with torch.no_grad():
        if teacher is None:
            return (attn._heads(attn.q_proj(query), torch.float32), attn._heads(attn.k_proj(key), torch.float32))
        return tuple(attn._heads(F.linear(x, *(t.to(x) for t in teacher[name])), torch.float32)
                     for x, name in ((query, "q_proj"), (key, "k_proj")))


def teacher_weights(attn, query, key, key_padding_mask, teacher=None):
    """(the teacher's A [B, H, T, S] in float32, keep [B, 1, T, S], scored query rows [B, H, T]) of a block's inputs
    query [T, B, C], key [S, B, C]."""
    q_t, k_t = teacher_heads(attn, query, key, teacher)
    bsz, heads, length, _ = q_t.shape
    keep, rows = masks(attn, key_padding_mask, bsz, heads, length, k_t.shape[2], q_t.device)
    scores = (q_t @ k_t.transpose(-1, -2)) / math.sqrt(q_t.shape[-1])  # [B, H, T, S]
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1), keep, rows


def attention_weights(attn, query, key, key_padding_mask, teacher=None):
    """(teacher A, student A', scored query rows [B, H, T] bool) of a FastWeightAttention block from its inputs
    query [T, B, C], key [S, B, C]; A and A' [B, H, T, S] in float32, A' with the aligned prior where it is on."""
    weights, keep, rows = teacher_weights(attn, query, key, key_padding_mask, teacher)
    bsz, _, length, src_len = weights.shape
    q, k = (attn._heads(proj(x), torch.float32) for proj, x in ((attn.q_proj, query), (attn.k_proj, key)))
    phi_q, phi_k = attn.block.features(q, is_query=True), attn.block.features(k, is_query=False)  # [B, H, T|S, E]
    scores = phi_q @ phi_k.transpose(-1, -2)  # [B, H, T, S]
    prior = aligned_prior(attn, key_padding_mask, bsz, length, src_len, weights.device)
    scores = (scores if prior is None else scores * prior).masked_fill(~keep, 0.0)
    return weights, scores / (scores.sum(-1, keepdim=True) + Z_EPS), rows


def student_read(attn, query, key, key_padding_mask):
    """The block's read [B, H, T, D] of its inputs in float32, through its own training path (before the output
    projection, its convolution and its gate)."""
    dtype = torch.float32
    q = attn._heads(attn.q_proj(query), dtype)
    writes = attn._writes(attn._project(key), key_padding_mask, dtype, dtype)
    if attn.path == CROSS and attn.cross_align:
        return aligned_read(attn.block, attn.cross_align, attn.align_ratio, q, writes.keys, writes.v, writes.scalars,
                            key_padding_mask, dtype, attn.align_free_heads)
    return attn._attend(q, writes, key_padding_mask, dtype)


def kl_rows(teacher, student, rows):
    """sum over the scored rows of KL(teacher row || student row): [B, H, T, S] each, rows [B, H, T]."""
    log_ratio = torch.log(teacher.clamp_min(1e-30)) - torch.log(student.clamp_min(1e-30))
    kl = (torch.where(teacher > 0, teacher * log_ratio, torch.zeros_like(teacher))).sum(-1)  # [B, H, T]
    return kl[rows].sum()


def block_loss(attn, query, key, key_padding_mask, teacher=None):
    """(kind "kl" or "read_mse", the block's loss summed over its scored rows, how many rows)."""
    if not reads_values(attn):
        weights, student, rows = attention_weights(attn, query, key, key_padding_mask, teacher)
        return "kl", kl_rows(weights, student, rows), int(rows.sum())
    weights, _, rows = teacher_weights(attn, query, key, key_padding_mask, teacher)
    with torch.no_grad():
        v = attn._heads(attn.v_proj(key), torch.float32)  # [B, H, S, D]: the teacher's values (v stays frozen)
        target = weights @ v  # [B, H, T, D]
    error = (student_read(attn, query, key, key_padding_mask) - target).pow(2).mean(-1)  # [B, H, T]
    return "read_mse", error[rows].sum(), int(rows.sum())


@contextmanager
def block_losses(model, teachers=None):
    """Within it, each FastWeightAttention forward of `model` appends block_loss's (kind, loss, rows) to the list it
    yields (`teachers`: {block: its teacher projections}, else the blocks' own): hooks on the blocks' inputs, taken
    off again on leaving."""
    losses, handles = [], []

    def hook(module, args, kwargs, output):
        bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments
        if bound.get("incremental_state") is not None:
            return  # generation: no teacher rows to match
        key = bound["key"] if bound.get("key") is not None else bound["query"]
        with torch.enable_grad():
            losses.append(block_loss(module, bound["query"], key, bound.get("key_padding_mask"),
                                     (teachers or {}).get(module)))

    for module in model.modules():
        if isinstance(module, FastWeightAttention):
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        yield losses
    finally:
        for handle in handles:
            handle.remove()


def trained_parameters(model, trains):
    """The parameters distillation trains: every block's feature map's, with `projections` also its q, k and
    scalar (beta, alpha) projections."""
    blocks = [module for module in model.modules() if isinstance(module, FastWeightAttention)]
    params = [p for attn in blocks for p in attn.phi.parameters()]
    if trains == "projections":
        params += [p for attn in blocks for name in (*PROJECTIONS, *(f"{s}_proj" for s in attn.rule.scalars))
                   for p in getattr(attn, name).parameters()]
    if not params:
        names = sorted({type(attn.phi).__name__ for attn in blocks}) or ["no fast-weight block"]
        raise cli_error(f"--criterion {NAME}: the model's feature maps ({', '.join(names)}) have no parameters to "
                        f"distil; allowed: --fw-feature-map t2r, hedgehog with --fw-hedgehog-trainable, or "
                        f"--distil-trains projections --distil-teacher CONVERTED.pt")
    return params


def freeze_all_but(model, params):
    model.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)


def teacher_projections(model, path):
    """{block: {"q_proj": (weight, bias), "k_proj": ...}} of every fast-weight block, from the checkpoint `path`."""
    state = checkpoint_utils.load_checkpoint_to_cpu(path)["model"]  # the plugin's one-line refusal of a bad file
    teachers = {}
    for name, attn in model.named_modules():
        if isinstance(attn, FastWeightAttention):
            try:
                teachers[attn] = {p: (state[f"{name}.{p}.weight"], state[f"{name}.{p}.bias"]) for p in PROJECTIONS}
            except KeyError as missing:
                raise cli_error(f"--distil-teacher {path}: no {missing.args[0]}; allowed: the checkpoint the model "
                                f"was converted into (convert_softmax --to)")
    return teachers


@dataclass
class AttentionDistillationConfig(FairseqDataclass):
    distil_trains: ChoiceEnum(list(TRAINS)) = field(default="maps", metadata={
        "help": "maps: only the feature maps' parameters train; projections: also each fast-weight block's q, k, "
                "beta and alpha projections (a map without parameters distils through them), against the teacher's "
                "q, k projections of --distil-teacher"})
    distil_teacher: Optional[str] = field(default=None, metadata={
        "help": "with --distil-trains projections: the converted checkpoint (convert_softmax --to), whose q and k "
                "projections are the teacher's"})


@register_criterion(NAME, dataclass=AttentionDistillationConfig)
class AttentionDistillationCriterion(FairseqCriterion):
    def __init__(self, task, distil_trains="maps", distil_teacher=None):
        super().__init__(task)
        self.trains, self.teacher_path = str(distil_trains), distil_teacher
        if (self.trains == "projections") != (distil_teacher is not None):
            raise cli_error(f"--distil-teacher goes with --distil-trains projections and only with it (got "
                            f"--distil-trains {self.trains}, --distil-teacher {distil_teacher})")
        if distil_teacher is not None and not os.path.isfile(distil_teacher):
            raise cli_error(f"--distil-teacher {distil_teacher}: no such file; allowed: the checkpoint the model was "
                            f"converted into (convert_softmax --to)")
        self.teachers = None  # {block: its teacher projections} with `projections`; a plain dict, not saved

    def forward(self, model, sample, reduce=True):
        if self.teachers is None:
            freeze_all_but(model, trained_parameters(model, self.trains))
            self.teachers = teacher_projections(model, self.teacher_path) if self.teacher_path else {}
        with block_losses(model, self.teachers) as losses, torch.no_grad():  # the model's output is not trained
            model(**sample["net_input"])
        loss = sum(loss for _, loss, _ in losses)
        rows = sum(count for _, _, count in losses)
        logging_output = {"loss": loss.detach(), "ntokens": sample["ntokens"], "nsentences": sample["nsentences"],
                          "sample_size": rows}
        for kind in ("kl", "read_mse"):
            logging_output[kind] = sum(float(loss.detach()) for k, loss, _ in losses if k == kind)
            logging_output[f"{kind}_rows"] = sum(count for k, _, count in losses if k == kind)
        return loss, rows, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        rows = total("sample_size")
        # per scored row of a block and head; nats (KL), not bits: the scale Hedgehog reports
        metrics.log_scalar("loss", total("loss") / max(rows, 1), rows, round=4)
        for kind in ("kl", "read_mse"):
            if total(f"{kind}_rows"):
                metrics.log_scalar(kind, total(kind) / total(f"{kind}_rows"), total(f"{kind}_rows"), round=4)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
