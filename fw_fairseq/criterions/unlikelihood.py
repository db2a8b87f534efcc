"""`--criterion fw_unlikelihood`: label-smoothed cross-entropy plus token-level unlikelihood (Welleck et al. 2020,
"Neural Text Generation with Unlikelihood Training"), a training-side cure for a decoder that repeats itself.

At each target position t the candidates C_t are the tokens of the reference's previous positions (the last
`--unlikelihood-window` of them; 0: all), less the reference's own token y_t and padding, and the loss adds

    alpha * sum_t sum_{c in C_t} -log(1 - p(c | y_<t))

to label_smoothed_cross_entropy's: probability put on writing again what was already written, where the reference
does not, is pushed down. A decoder that has started a loop ("E E E E", "den Sie den Sie") predicts its previous
tokens; this term is what teaches it, in training, that they are unlikely.

With `--unlikelihood-candidates continuations` only the tokens that would continue a repeat are candidates: the
last token y_{t-1} (written again: "E E") and every y_j whose own previous token y_{j-1} is y_{t-1} (what followed
the last token where it was written before: "den Sie den" -> "Sie"). A loop is made of such tokens, while a word the
message needs again in a new context ("die", ",") is not pushed down.

The logged `loss` and `nll_loss` are label_smoothed_cross_entropy's, so that valid losses compare with models
trained without the term; `ul_loss` is the added term per target token, before alpha, in bits as fairseq logs
its losses.
"""
import math
from dataclasses import dataclass, field

import torch
from fairseq import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (LabelSmoothedCrossEntropyCriterion,
                                                             LabelSmoothedCrossEntropyCriterionConfig,
                                                             label_smoothed_nll_loss)
from fairseq.dataclass import ChoiceEnum

from fw_fairseq.modules.fast_weight_flags import cli_error

NAME = "fw_unlikelihood"
ONE_MINUS_P_FLOOR = 1e-5  # -log(1 - p) at most 11.5 nats: a candidate at p = 1 gives a finite gradient


def previous_tokens(target, pad, window=0):
    """[B, T, D] token ids of the D positions before each position of target [B, T] (D = window, or T - 1 for
    every one), oldest first; `pad` where a position has fewer than D before it."""
    length = target.shape[1]
    depth = length - 1 if window == 0 else min(window, length - 1)
    if depth == 0:
        return target.new_full((*target.shape, 0), pad)
    padded = torch.nn.functional.pad(target, (depth, 0), value=pad)  # [B, D + T]
    return padded.unfold(1, depth, 1)[:, :length]  # [B, T + 1, D] windows; the one at t ends just before t


def continuations(target, pad, window=0):
    """[B, T, D] previous_tokens with every token that does not continue a repeat set to `pad`: at position t the
    slot of y_j stays if j = t - 1 (the last token) or y_{j-1} = y_{t-1} (it followed the last token before)."""
    previous = previous_tokens(target, pad, window)  # [B, T, D], y_j for j = t - D .. t - 1
    context = torch.nn.functional.pad(target, (1, 0), value=pad)[:, :-1]  # [B, T]: y_{t-1}, pad at t = 0
    before = previous_tokens(context, pad, window)  # [B, T, D]: y_{j-1} beside each y_j
    follows = (before == context.unsqueeze(-1)) & (before != pad)
    follows[..., -1:] = True  # the last slot is y_{t-1} itself
    return previous.masked_fill(~follows, pad)


def candidates(target, pad, window=0, kind="previous"):
    """(tokens, keep), both [B, T, D]: the previous tokens of each position of target [B, T] (`kind`
    "continuations": only those that continue a repeat), sorted, and whether each is a candidate: its first copy in
    the row, neither the reference's token y_t nor padding, at a position that is not padding. The set of a
    position's candidates, without building [B, T, V]."""
    tokens, _ = CANDIDATES[kind](target, pad, window).sort(dim=-1)  # [B, T, D]
    first = torch.ones_like(tokens, dtype=torch.bool)
    first[..., 1:] = tokens[..., 1:] != tokens[..., :-1]  # sorted: a repeat sits beside its first copy
    here = target.unsqueeze(-1)  # [B, T, 1]
    return tokens, first & (tokens != pad) & (tokens != here) & (here != pad)


def unlikelihood(lprobs, target, pad, window=0, kind="previous"):
    """sum over positions and candidates of -log(1 - p(c)): lprobs [B, T, V] log-probabilities, target [B, T].
    Only the candidates' log-probabilities are gathered ([B, T, D]), so the term costs little beside the model."""
    tokens, keep = candidates(target, pad, window, kind)
    one_minus_p = (1.0 - lprobs.gather(-1, tokens).exp()).clamp_min(ONE_MINUS_P_FLOOR)  # [B, T, D]
    return -(torch.log(one_minus_p) * keep).sum()


# --unlikelihood-candidates: each kind's previous tokens, [B, T, D], before the first-copy and y_t filters
CANDIDATES = {"previous": previous_tokens, "continuations": continuations}


@dataclass
class UnlikelihoodConfig(LabelSmoothedCrossEntropyCriterionConfig):
    # 2: with the translation models' defaults the weight that meets every long-output mark (docs/long_outputs.md)
    unlikelihood_alpha: float = field(default=2.0, metadata={"help": "weight of the unlikelihood term, >= 0"})
    unlikelihood_window: int = field(default=0, metadata={
        "help": "the candidates are the reference's last N tokens before each position; 0: all of them"})
    unlikelihood_candidates: ChoiceEnum(list(CANDIDATES)) = field(default="previous", metadata={
        "help": "previous: every previous token; continuations: the last token and what followed it before"})


@register_criterion(NAME, dataclass=UnlikelihoodConfig)
class UnlikelihoodCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, unlikelihood_alpha=2.0, unlikelihood_window=0,
                 unlikelihood_candidates="previous", ignore_prefix_size=0, report_accuracy=False):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if not unlikelihood_alpha >= 0:  # NaN included
            raise cli_error(f"--unlikelihood-alpha must be 0 or more, got {unlikelihood_alpha}")
        if unlikelihood_window < 0:
            raise cli_error(f"--unlikelihood-window must be 0 (every previous token) or more, got "
                            f"{unlikelihood_window}")
        self.alpha, self.window, self.kind = unlikelihood_alpha, unlikelihood_window, str(unlikelihood_candidates)

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        # one log-softmax for both terms: [B * T, V] and [B * T], the ignored prefix already cut
        lprobs, target = self.get_lprobs_and_target(model, net_output, sample)
        loss, nll_loss = label_smoothed_nll_loss(lprobs, target, self.eps, ignore_index=self.padding_idx,
                                                 reduce=reduce)
        bsz = sample["target"].size(0)
        ul_loss = unlikelihood(lprobs.view(bsz, -1, lprobs.size(-1)), target.view(bsz, -1), self.padding_idx,
                               self.window, self.kind)  # [B, T, V] and [B, T]
        sample_size = bsz if self.sentence_avg else sample["ntokens"]
        logging_output = {"loss": loss.data, "nll_loss": nll_loss.data, "ul_loss": ul_loss.data,
                          "ntokens": sample["ntokens"], "nsentences": bsz, "sample_size": sample_size}
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"], logging_output["total"] = n_correct.item(), total.item()
        return loss + self.alpha * ul_loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        ul_loss = sum(log.get("ul_loss", 0) for log in logging_outputs)
        ntokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        metrics.log_scalar("ul_loss", ul_loss / max(ntokens, 1) / math.log(2), ntokens, round=3)
