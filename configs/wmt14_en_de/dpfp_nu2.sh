# Table 1 "DPFP": nu = 2, d_dot = 2 * d_key * nu = 256 (Table 6).
TABLE1_ROW="DPFP"
TABLE1_DDOT=256
FW_ARGS=(--fw-preset paper --fw-feature-map dpfp --fw-dpfp-nu 2)
