# Table 1 "Linear": linear Transformer (Katharopoulos et al. 2020), phi = ELU + 1, d_dot = d_key = 64.
TABLE1_ROW="Linear"
TABLE1_DDOT=64
FW_ARGS=(--fw-preset paper --fw-feature-map elu)
