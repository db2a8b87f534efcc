# Beyond Table 1: dpfp_nu2_delta's fast weights (DPFP nu = 2, d_dot = 256; the delta rule in the decoder's
# self-attention, the sum rule in the encoder, phi normalised by its sum) with softmax cross-attention. A fast-weight
# read of a long source mixes a fixed share of its positions, and on long messages such decoders start loops within
# their first words; softmax cross-attention reads the source narrowly. On the German catalog benchmark it is the best
# setting measured (docs/long_outputs.md). Its decoding step reads every source position, as softmax's does.
TABLE1_ROW="DPFP + delta, softmax cross-attention"
TABLE1_DDOT=256
FW_ARGS=(--fw-preset paper --fw-feature-map dpfp --fw-dpfp-nu 2 --fw-attention encoder,decoder --fw-decoder-rule delta)
