"""Flags that several of the attention comparison's rows share (attention_configs.py, long_output_rows.py)."""
DPFP2 = ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2"]
NO_CONV, CONV3 = ["--fw-encoder-conv", "0"], ["--fw-encoder-conv", "3"]
NOPOS = ["--fw-decoder-positions", "none"]
DCONV3 = ["--fw-decoder-conv", "3"]
# The sum rule in every block, the decoder's self-attention named too: the translation models give it the delta rule
SUM = ["--fw-update-rule", "sum", "--fw-decoder-rule", "sum"]
# A row without --fw-cross-align reads the source as the paper does: every row names its rules, and this its read,
# so that a row stays the model it was measured as whatever the translation models' defaults
PLAIN_READ = ["--fw-cross-align", "0"]
# and a FAVOR+ row without these the delta rule's beta in (0, 1) and no decoder convolution, as the other maps have
# them (the translation models give FAVOR+ other defaults: flag_table.FAVOR)
FAVOR_AS_THE_OTHERS = {"--fw-delta-beta-max": "1", "--fw-decoder-conv": "0"}
# The translation models' defaults apart from the map, spelled out: the sum-normalised delta rule in the decoder and
# the sum rule elsewhere, the aligned read of the source; FAVOR+ with its features drawn once
DELTA_DEC = ["--fw-update-rule", "sum", "--fw-decoder-rule", "delta", "--fw-delta-norm", "sum"]
ALIGN4 = ["--fw-cross-align", "4"]
FAVOR_FIXED = ["--fw-feature-map", "favor", "--fw-favor-redraw", "never"]


def unlikelihood(alpha):
    """Training with token-level unlikelihood at weight `alpha` (a string, as fairseq's flag takes it)."""
    return ["--criterion", "fw_unlikelihood", "--unlikelihood-alpha", alpha]


UNLIKELIHOOD = unlikelihood("1")


def last_layer_sum(rule):
    """A --fw-decoder-rule per layer: `rule` in every decoder layer but the last, the sum rule there (spelled out
    for a preset's depth by config_flags)."""
    return lambda layers: ",".join([rule] * (layers - 1) + ["sum"])


DELTA_THEN_SUM, DELTAZ_THEN_SUM = last_layer_sum("delta"), last_layer_sum("delta_z")
