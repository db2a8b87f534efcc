# Beyond Table 1: dpfp_nu2_delta's fast weights (DPFP nu = 2, d_dot = 256; the delta rule in the decoder's
# self-attention, the sum rule in the encoder and over the source, phi normalised by its sum) with the aligned
# cross-attention (--fw-cross-align 4): the read of the source weighted towards the position that the target
# position aligns with, still a fast-weight memory written once per sentence. Trained with token-level unlikelihood
# at alpha 2 beside label-smoothed cross-entropy: on the German catalog benchmark the aligned read alone keeps long
# translations long but lets more of them run away than softmax; with the term it is the setting with fast weights in
# every block that meets every long-output mark (docs/long_outputs.md).
TABLE1_ROW="DPFP + delta, aligned cross-attention, unlikelihood"
TABLE1_DDOT=256
CRITERION_ARGS=(--criterion fw_unlikelihood --unlikelihood-alpha 2)
FW_ARGS=(--fw-preset paper --fw-feature-map dpfp --fw-dpfp-nu 2 --fw-decoder-rule delta --fw-cross-align 4)
