# Table 1 "Standard": the big Transformer with softmax attention everywhere (d_key = 64).
TABLE1_ROW="Standard"
TABLE1_DDOT=64
FW_ARGS=(--fw-attention none)
