# Beyond Table 1: DPFP nu = 2 (d_dot = 256) with the delta update rule (Sec. 4.2) in the decoder's
# self-attention, the causal stream the paper derives it for, and the sum rule over the source; phi
# L2-normalised. On the catalog benchmark (results/compare_attention) this was the best fast-weight
# row at 600 updates; the paper reports no MT number for the delta rule.
TABLE1_ROW="DPFP + delta"
TABLE1_DDOT=256
FW_ARGS=(--fw-feature-map dpfp --fw-dpfp-nu 2 --fw-update-rule sum --fw-decoder-rule delta --fw-delta-norm l2 --fw-encoder-conv 0)
