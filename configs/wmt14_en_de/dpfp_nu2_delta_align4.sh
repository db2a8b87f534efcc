# Beyond Table 1: dpfp_nu2_delta's fast weights (DPFP nu = 2, d_dot = 256; the delta rule in the decoder's
# self-attention, the sum rule in the encoder and over the source, phi normalised by its sum) with the aligned
# cross-attention (--fw-cross-align 4): the read of the source weighted towards the position that the target
# position aligns with, still a fast-weight memory written once per sentence. A plain fast-weight read of a long
# source mixes a fixed share of its positions; on the German catalog benchmark the aligned read is the best setting
# measured with fast weights in every block (docs/long_outputs_aligned.md).
TABLE1_ROW="DPFP + delta, aligned cross-attention"
TABLE1_DDOT=256
FW_ARGS=(--fw-feature-map dpfp --fw-dpfp-nu 2 --fw-update-rule sum --fw-decoder-rule delta --fw-delta-norm sum --fw-cross-align 4 --fw-encoder-conv 0)
