"""The sum rule (paper §3): W_t = W_{t-1} + phi(k_t) v_t^T, read through the z column."""
