# Table 1 "Performer": FAVOR+ with m = 128 random features, d_dot = 2m = 256 (Table 6).
TABLE1_ROW="Performer"
TABLE1_DDOT=256
FW_ARGS=(--fw-preset paper --fw-feature-map favor --fw-favor-features 128)
