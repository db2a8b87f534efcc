"""`--criterion fw_attention_distillation`: Hedgehog's first stage (Zhang et al. 2024) for a converted model.

Each fast-weight block's learned feature map is trained to make the block attend as the softmax teacher did, on the
fly in the same forward: from the block's own q and k (the teacher's projections, copied by
fw_research.convert.convert_softmax and frozen here),

    teacher  A = softmax(q k^T / sqrt(d))                      padded keys masked, causal in decoder self-attention
    student  A' = phi(q) phi(k)^T / (sum_s phi(q) phi(k_s)^T + Z_EPS)   the same masks: the sum rule's read weights

and the loss is KL(A || A') = sum A (log A - log A'), summed over the blocks, heads and query rows (the padded
queries of encoder self-attention left out), logged per row. KL is the soft cross-entropy -sum A log A' less the
teacher's entropy, which does not depend on phi: the same gradients, and 0 where A' = A.

The delta rules (delta, gated_delta) read sum_s (phi(q_t) . phi(k_s)) u_s with effective writes u = T_beta v
(ops/README.md §2): as weights over the written values tril(phi(Q) phi(K)^T) T_beta has signed entries whose rows do
not sum to 1, so it is no distribution to match by cross-entropy. For them A' is the proxy above, the sum-rule
weights of the block's own normalised phi (--fw-delta-norm): what the delta read retrieves is addressed by the same
scores phi(q) . phi(k_s), so a phi whose scores put the teacher's mass on the teacher's keys is what the rule needs;
beta and alpha, which the proxy leaves out, are then learned in the fine-tuning stage.

Only the feature maps' parameters train: the first forward freezes every other parameter of the model (so fairseq's
optimizer, which skips parameters without gradients, leaves them as converted), and a model whose maps have no
parameters (dpfp, elu, favor, hedgehog without --fw-hedgehog-trainable) is refused in one line.
"""
import inspect
import math
from contextlib import contextmanager

import torch
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion

from fw_fairseq.modules.fast_weight_attention import CAUSAL, ENCODER, FastWeightAttention
from fw_fairseq.modules.fast_weight_flags import cli_error
from fw_fairseq.ops.common.z_column import Z_EPS

NAME = "fw_attention_distillation"


def attention_weights(attn, query, key, key_padding_mask):
    """(teacher A, student A', scored query rows [B, H, T] bool) of a FastWeightAttention block from its inputs
    query [T, B, C], key [S, B, C]; A and A' [B, H, T, S] in float32."""
    with torch.no_grad():  # the projections are the teacher's: frozen, no graph
        q = attn._heads(attn.q_proj(query), torch.float32)  # [T, B, C] -> [B, H, T, D]
        k = attn._heads(attn.k_proj(key), torch.float32)  # [S, B, C] -> [B, H, S, D]
        bsz, heads, length, _ = q.shape
        keep = torch.ones(bsz, 1, length, k.shape[2], dtype=torch.bool, device=q.device)  # [B, 1, T, S]
        if key_padding_mask is not None:
            keep = keep & ~key_padding_mask.bool()[:, None, None, :]
        if attn.path == CAUSAL:
            keep = keep & torch.ones(length, k.shape[2], dtype=torch.bool, device=q.device).tril()
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # [B, H, T, S]
        teacher = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
        rows = keep.any(-1).expand(bsz, heads, length)  # [B, H, T]
        if attn.path == ENCODER and key_padding_mask is not None:  # a padded query's row is no position
            rows = rows & ~key_padding_mask.bool()[:, None, :]
    phi_q, phi_k = attn.block.features(q, is_query=True), attn.block.features(k, is_query=False)  # [B, H, T|S, E]
    scores = (phi_q @ phi_k.transpose(-1, -2)).masked_fill(~keep, 0.0)  # [B, H, T, S]
    student = scores / (scores.sum(-1, keepdim=True) + Z_EPS)
    return teacher, student, rows


def kl_rows(teacher, student, rows):
    """sum over the scored rows of KL(teacher row || student row): [B, H, T, S] each, rows [B, H, T]."""
    log_ratio = torch.log(teacher.clamp_min(1e-30)) - torch.log(student.clamp_min(1e-30))
    kl = (torch.where(teacher > 0, teacher * log_ratio, torch.zeros_like(teacher))).sum(-1)  # [B, H, T]
    return kl[rows].sum()


@contextmanager
def block_losses(model):
    """Within it, each FastWeightAttention forward of `model` appends (its summed KL, its scored rows) to the list it
    yields: hooks on the blocks' inputs, taken off again on leaving."""
    losses, handles = [], []

    def hook(module, args, kwargs, output):
        bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments
        if bound.get("incremental_state") is not None:
            return  # generation: no teacher rows to match
        key = bound["key"] if bound.get("key") is not None else bound["query"]
        with torch.enable_grad():
            teacher, student, rows = attention_weights(module, bound["query"], key, bound.get("key_padding_mask"))
            losses.append((kl_rows(teacher, student, rows), int(rows.sum())))

    for module in model.modules():
        if isinstance(module, FastWeightAttention):
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        yield losses
    finally:
        for handle in handles:
            handle.remove()


def freeze_all_but_maps(model):
    """requires_grad only on the blocks' feature-map parameters; refuse a model whose maps have none."""
    maps = [module.phi for module in model.modules() if isinstance(module, FastWeightAttention)]
    learned = [p for phi in maps for p in phi.parameters()]
    if not learned:
        names = sorted({type(phi).__name__ for phi in maps}) or ["no fast-weight block"]
        raise cli_error(f"--criterion {NAME}: the model's feature maps ({', '.join(names)}) have no parameters to "
                        f"distil; allowed: --fw-feature-map t2r, or hedgehog with --fw-hedgehog-trainable")
    model.requires_grad_(False)
    for p in learned:
        p.requires_grad_(True)


@register_criterion(NAME)
class AttentionDistillationCriterion(FairseqCriterion):
    def __init__(self, task):
        super().__init__(task)
        self.frozen = False

    def forward(self, model, sample, reduce=True):
        if not self.frozen:
            freeze_all_but_maps(model)
            self.frozen = True
        with block_losses(model) as losses, torch.no_grad():  # the model's own output is not trained here
            model(**sample["net_input"])
        loss = sum(loss for loss, _ in losses)
        rows = sum(count for _, count in losses)
        logging_output = {"loss": loss.detach(), "ntokens": sample["ntokens"], "nsentences": sample["nsentences"],
                          "sample_size": rows}
        return loss, rows, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        rows = sum(log.get("sample_size", 0) for log in logging_outputs)
        # per scored row of a block and head; nats (KL), not bits: the scale Hedgehog reports
        metrics.log_scalar("loss", loss / max(rows, 1), rows, round=4)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
