# Beyond Table 1: DPFP nu = 2 (d_dot = 256) with the delta update rule (Sec. 4.2) in the decoder's
# self-attention, the causal stream the paper derives it for, and the sum rule over the source; phi
# normalised by its sum, as in the paper's delta rule. With L2-normalised phi a repeated write leaves
# the state unchanged and long translations run away in loops; with sum normalisation they do not, at
# the same test BLEU (docs/long_outputs.md). The paper reports no MT number for the delta rule.
TABLE1_ROW="DPFP + delta"
TABLE1_DDOT=256
FW_ARGS=(--fw-preset paper --fw-feature-map dpfp --fw-dpfp-nu 2 --fw-decoder-rule delta)
