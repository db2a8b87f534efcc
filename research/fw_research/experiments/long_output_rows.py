"""The attention comparison's rows behind the translation models' long-output defaults: unlikelihood training, the
aligned read and the delta rule in the decoder with each map, and the settings measured beside them
(docs/long_outputs.md). attention_configs.CONFIGS holds them after its own rows."""
from fw_research.experiments.row_flags import (ALIGN4, CONV3, DCONV3, DELTA_DEC, DPFP2, FAVOR_FIXED, NO_CONV, SUM,
                                              UNLIKELIHOOD, unlikelihood)

UL2 = unlikelihood("2")
ELU, HEDGEHOG = ["--fw-feature-map", "elu"], ["--fw-feature-map", "hedgehog"]
CONTINUATIONS = ["--unlikelihood-candidates", "continuations"]


def beta_max(value):
    """The delta rule's beta capped at `value` (a string, as fairseq's flag takes it)."""
    return ["--fw-delta-beta-max", value]


LONG_OUTPUT_ROWS = {
    # trained with token-level unlikelihood (--criterion fw_unlikelihood, alpha 1): probability put on the
    # reference's previous tokens is pushed down in training, where the loops start (docs/long_outputs.md)
    "softmax-ul1": ("softmax", ["--fw-attention", "none", *UNLIKELIHOOD]),
    # the baselines that have what the default has beyond fast weights: its criterion (fw_unlikelihood's alpha 2),
    # its prior on the cross-attention (softmax adds log cos^8 to its logits), both; and the paper's blocks with the
    # prior, so that a table separates what the fast weights add from what the criterion and the prior give
    "softmax-ul2": ("softmax", ["--fw-attention", "none", *UL2]),
    "softmax-align4": ("softmax", ["--fw-attention", "none", *ALIGN4]),
    "softmax-align4-ul2": ("softmax", ["--fw-attention", "none", *ALIGN4, *UL2]),
    "dpfp2-sum-align4": ("fast", [*DPFP2, *SUM, *ALIGN4, *NO_CONV]),
    "dpfp2-sum-ul1-vconv3": ("fast", [*DPFP2, *SUM, *CONV3, *UNLIKELIHOOD]),
    # the candidates only the last 4 tokens (--unlikelihood-window 4, the longest n-gram the loop count looks for):
    # fewer tokens pushed down as the translation grows, so the end of sentence gains less on long ones
    "dpfp2-sum-ul1w4-vconv3": ("fast", [*DPFP2, *SUM, *CONV3, *UNLIKELIHOOD, "--unlikelihood-window", "4"]),
    # between the two: the last 8 tokens, about a quarter of a long message's subword tokens
    "dpfp2-sum-ul1w8-vconv3": ("fast", [*DPFP2, *SUM, *CONV3, *UNLIKELIHOOD, "--unlikelihood-window", "8"]),
    # half the weight (--unlikelihood-alpha 0.5), every previous token
    "dpfp2-sum-ul05-vconv3": ("fast", [*DPFP2, *SUM, *CONV3, *unlikelihood("0.5")]),
    # the candidates only the tokens that continue a repeat (--unlikelihood-candidates continuations): the last
    # token and what followed it before, so that words a long message needs again are not pushed down
    "dpfp2-sum-ul1c-vconv3": ("fast", [*DPFP2, *SUM, *CONV3, *UNLIKELIHOOD, *CONTINUATIONS]),
    "dpfp2-delta-dec-ul1c-vconv3": ("fast", [*DPFP2, *DELTA_DEC, *CONV3, *UNLIKELIHOOD, *CONTINUATIONS]),
    "dpfp2-delta-dec-align4-ul1c-vconv3": ("fast", [*DPFP2, *DELTA_DEC, *ALIGN4, *CONV3, *UNLIKELIHOOD,
                                                    *CONTINUATIONS]),
    "dpfp2-delta-dec-ul1-vconv3": ("fast", [*DPFP2, *DELTA_DEC, *CONV3, *UNLIKELIHOOD]),
    "dpfp2-delta-dec-align4-ul1-vconv3": ("fast", [*DPFP2, *DELTA_DEC, *ALIGN4, *CONV3, *UNLIKELIHOOD]),
    # the decoder's convolution with the term: the convolution keeps the long translations' length on the base
    # preset, the term ends the loops that run to the length limit on the demo preset
    "dpfp2-sum-dconv3-ul1-vconv3": ("fast", [*DPFP2, *SUM, *DCONV3, *CONV3, *UNLIKELIHOOD]),
    "dpfp2-sum-dconv3-ul1c-vconv3": ("fast", [*DPFP2, *SUM, *DCONV3, *CONV3, *UNLIKELIHOOD, *CONTINUATIONS]),
    "dpfp2-delta-dec-dconv3-ul1-vconv3": ("fast", [*DPFP2, *DELTA_DEC, *DCONV3, *CONV3, *UNLIKELIHOOD]),
    # the aligned read keeps the long translations' length that the term takes away; twice the term's weight for the
    # loops the term alone leaves running to the length limit on the demo preset (docs/long_outputs.md)
    "dpfp2-delta-dec-align4-ul2-vconv3": ("fast", [*DPFP2, *DELTA_DEC, *ALIGN4, *CONV3, *UL2]),
    # the same with the prior's length ratio counted from the training split (German runs 1.19x the English tokens
    # of the catalogs): target position i aims at source position i / 1.19, not i
    "dpfp2-delta-dec-align4r-ul2-vconv3": ("fast", [*DPFP2, *DELTA_DEC, *ALIGN4, "--fw-align-ratio", "data", *CONV3,
                                                    *UL2]),
    # the same with the last head of each cross-attention free of the prior (--fw-align-free-heads 1: one of the
    # demo preset's 2 heads, of the base preset's 4): a prior fixed for every head can hurt unless some stay free
    "dpfp2-delta-dec-align4f1-ul2-vconv3": ("fast", [*DPFP2, *DELTA_DEC, *ALIGN4, "--fw-align-free-heads", "1",
                                                     *CONV3, *UL2]),
    # the shipped sum rule with the same read and term: whether the default's rule needs the delta rule to meet them
    "dpfp2-sum-align4-ul2-vconv3": ("fast", [*DPFP2, *SUM, *ALIGN4, *CONV3, *UL2]),
    # the other shipped maps with the sum rule, the same read and term
    "elu-sum-align4-ul2-vconv3": ("fast", [*ELU, *SUM, *ALIGN4, *CONV3, *UL2]),
    "hedgehog-sum-align4-ul2-vconv3": ("fast", [*HEDGEHOG, *SUM, *ALIGN4, *CONV3, *UL2]),
    "favor-sum-fixed-align4-ul2-vconv3": ("fast", [*FAVOR_FIXED, *SUM, *ALIGN4, *CONV3, *UL2]),
    # the same maps with the delta rule in the decoder, as DPFP-2's row above: whether the rule that meets every mark
    # with DPFP-2 ends the runaways the sum rule leaves with FAVOR+ and ELU+1 on the demo preset
    "elu-delta-dec-align4-ul2-vconv3": ("fast", [*ELU, *DELTA_DEC, *ALIGN4, *CONV3, *UL2]),
    "hedgehog-delta-dec-align4-ul2-vconv3": ("fast", [*HEDGEHOG, *DELTA_DEC, *ALIGN4, *CONV3, *UL2]),
    "favor-delta-dec-fixed-align4-ul2-vconv3": ("fast", [*FAVOR_FIXED, *DELTA_DEC, *ALIGN4, *CONV3, *UL2]),
    # FAVOR+ with the other maps' defaults runs to the length limit more often than softmax on the demo preset:
    # twice the term's weight, or twice the random features (a closer estimate of softmax's kernel)
    "favor-delta-dec-fixed-align4-ul4-vconv3": ("fast", [*FAVOR_FIXED, *DELTA_DEC, *ALIGN4, *CONV3,
                                                         *unlikelihood("4")]),
    "favor256-delta-dec-fixed-align4-ul2-vconv3": ("fast", [*FAVOR_FIXED, "--fw-favor-features", "256", *DELTA_DEC,
                                                            *ALIGN4, *CONV3, *UL2]),
    # or the decoder's convolution, which cuts the loops of the base preset by 40-47%
    "favor-delta-dec-fixed-align4-dconv3-ul2-vconv3": ("fast", [*FAVOR_FIXED, *DELTA_DEC, *ALIGN4, *DCONV3, *CONV3,
                                                                *UL2]),
    # FAVOR+'s keys put nearly all of phi on one feature, so the sum-normalised delta rule's write moves its key's
    # slot most of the way, as the L2 rule's does: beta below 0.25 or 0.1 moves it a small share, as Hedgehog's do
    "favor-delta-dec-fixed-bmax025-align4-ul2-vconv3": ("fast", [*FAVOR_FIXED, *DELTA_DEC, *beta_max("0.25"),
                                                                 *ALIGN4, *CONV3, *UL2]),
    "favor-delta-dec-fixed-bmax01-align4-ul2-vconv3": ("fast", [*FAVOR_FIXED, *DELTA_DEC, *beta_max("0.1"), *ALIGN4,
                                                                *CONV3, *UL2]),
    # both: the smaller step and the decoder's convolution, the two that cut FAVOR+'s runs to the length limit most;
    # the translation models' defaults with FAVOR+ (flag_table.FAVOR)
    "favor-delta-dec-fixed-bmax025-align4-dconv3-ul2-vconv3": ("fast", [*FAVOR_FIXED, *DELTA_DEC, *beta_max("0.25"),
                                                                        *ALIGN4, *DCONV3, *CONV3, *UL2]),
}
