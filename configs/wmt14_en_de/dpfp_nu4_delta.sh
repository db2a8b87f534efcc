# Beyond Table 1: DPFP nu = 4 (d_dot = 512) with the paper's delta update rule (Sec. 4.2)
# instead of the sum rule; the paper reports no MT number for it.
TABLE1_ROW="DPFP + delta"
TABLE1_DDOT=512
FW_ARGS=(--fw-feature-map dpfp --fw-dpfp-nu 4 --fw-update-rule delta)
