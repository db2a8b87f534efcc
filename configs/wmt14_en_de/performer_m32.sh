# Table 1 "Performer": FAVOR+ with m = 32 random features, d_dot = 2m = 64.
TABLE1_ROW="Performer"
TABLE1_DDOT=64
FW_ARGS=(--fw-preset paper --fw-feature-map favor --fw-favor-features 32)
