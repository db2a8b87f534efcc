# Table 1 "DPFP": nu = 4, d_dot = 2 * d_key * nu = 512 (Table 6).
TABLE1_ROW="DPFP"
TABLE1_DDOT=512
FW_ARGS=(--fw-preset paper --fw-feature-map dpfp --fw-dpfp-nu 4)
