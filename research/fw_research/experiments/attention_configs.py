"""The attention comparison's rows and model presets: each configuration's fairseq flags, and the model and
optimiser every configuration shares under a preset. fw_research.demo.compare_attention trains them, the demo
(fw_research.demo.demo) trains a few of them, fw_research.benchmarks.bench_train_cpu times their updates, and
fw_research.convert.convert_study converts a softmax model into some of them.
"""
from fw_research.experiments.long_output_rows import LONG_OUTPUT_ROWS
from fw_research.experiments.row_flags import (CONV3, DELTAZ_THEN_SUM, DELTA_THEN_SUM, DPFP2, FAVOR_AS_THE_OTHERS,
                                              NOPOS, NO_CONV, PLAIN_READ, SUM)
# name -> (kind, flags). kind: softmax (the reference), fast (every block fast weights), hybrid
# (some blocks softmax: not a fast-weight model, e.g. fast weights in the decoder's self-attention
# only, where decoding cost grows with the output).
CONFIGS = {
    "softmax": ("softmax", ["--fw-attention", "none"]),
    "elu-sum": ("fast", ["--fw-feature-map", "elu", *SUM, *NO_CONV]),
    "dpfp2-sum": ("fast", [*DPFP2, *SUM, *NO_CONV]),
    # the paper's delta rule (sum-normalised phi) in every block
    "dpfp2-delta-all": ("fast", [*DPFP2, "--fw-update-rule", "delta", *NO_CONV]),
    # the delta rule where the paper derives it, the causal decoder; the sum rule over the source
    "dpfp2-delta-dec": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta", *NO_CONV]),
    "dpfp2-delta-dec-l2": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                    "--fw-delta-norm", "l2", *NO_CONV]),
    "dpfp2-delta-all-l2": ("fast", [*DPFP2, "--fw-update-rule", "delta", "--fw-delta-norm", "l2", *NO_CONV]),
    "dpfp2-delta-dec-l2-b2": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                       "--fw-delta-norm", "l2", "--fw-beta-bias", "2", *NO_CONV]),
    "elu-delta-dec-l2": ("fast", ["--fw-feature-map", "elu", "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                  "--fw-delta-norm", "l2", *NO_CONV]),
    "dpfp2-gated-dec-l2": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "gated_delta",
                                    "--fw-delta-norm", "l2", *NO_CONV]),
    "favor-sum": ("fast", ["--fw-feature-map", "favor", *SUM, "--fw-favor-redraw", "batch", *NO_CONV]),
    # FAVOR+ with the random features drawn once, not every training forward (the paper)
    "favor-sum-fixed": ("fast", ["--fw-feature-map", "favor", *SUM, "--fw-favor-redraw", "never", *NO_CONV]),
    # the wider DPFP of configs/wmt14_en_de/dpfp_nu4{,_delta}.sh (d_dot 512)
    "dpfp4-sum": ("fast", ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "4", *SUM, *NO_CONV]),
    "dpfp4-delta-dec-l2": ("fast", ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "4", "--fw-update-rule", "sum",
                                    "--fw-decoder-rule", "delta", "--fw-delta-norm", "l2", *NO_CONV]),
    # the learning rate the fast-weight models were proposed to need, and softmax's at the same
    "elu-sum-lr3e-3": ("fast", ["--fw-feature-map", "elu", *SUM, "--lr", "3e-3", *NO_CONV]),
    "softmax-lr3e-3": ("softmax", ["--fw-attention", "none", "--lr", "3e-3"]),
    # where the gap to softmax lies: DPFP-2 sum with softmax cross-attention, or with a softmax encoder
    "dpfp2-sum-softcross": ("hybrid", [*DPFP2, *SUM, "--fw-attention", "encoder,decoder", *NO_CONV]),
    "dpfp2-sum-softenc": ("hybrid", [*DPFP2, *SUM, "--fw-attention", "decoder,cross", *NO_CONV]),
    # the gap in the non-causal blocks' read: an output gate (beyond the paper), Hedgehog's exp feature map
    "dpfp2-sum-gate": ("fast", [*DPFP2, *SUM, "--fw-output-gate", "channel", *NO_CONV]),
    "elu-sum-gate": ("fast", ["--fw-feature-map", "elu", *SUM, "--fw-output-gate", "channel", *NO_CONV]),
    "dpfp2-delta-dec-l2-gate": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                         "--fw-delta-norm", "l2", "--fw-output-gate", "channel", *NO_CONV]),
    "dpfp2-sum-headgate": ("fast", [*DPFP2, *SUM, "--fw-output-gate", "head", *NO_CONV]),
    "hedgehog-sum": ("fast", ["--fw-feature-map", "hedgehog", *SUM, *NO_CONV]),
    "hedgehog-delta-dec-l2": ("fast", ["--fw-feature-map", "hedgehog", "--fw-update-rule", "sum",
                                       "--fw-decoder-rule", "delta", "--fw-delta-norm", "l2", *NO_CONV]),
    "hedgehog-sum-gate": ("fast", ["--fw-feature-map", "hedgehog", *SUM, "--fw-output-gate", "channel", *NO_CONV]),
    "hybrid-delta-l2": ("hybrid", [*DPFP2, "--fw-attention", "decoder", "--fw-update-rule", "delta",
                                   "--fw-delta-norm", "l2", *NO_CONV]),
    # --fw-encoder-conv (beyond the paper; the translation models' default 3 since it was measured): the
    # encoder's read plus a depthwise convolution of its values; the rows above were measured before it, at 0
    "dpfp2-sum-vconv3": ("fast", [*DPFP2, *SUM, *CONV3]),
    "dpfp2-delta-dec-l2-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                           "--fw-delta-norm", "l2", *CONV3]),
    # the delta configuration with the paper's sum-normalised phi instead of L2 (docs/long_outputs.md): a write
    # changes its key's slot by beta ||phi(k)||^2 of the difference, so repeated writes of one pair keep adding
    "dpfp2-delta-dec-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                        "--fw-delta-norm", "sum", *CONV3]),
    # the sum-normalised delta configuration with each decoder head's read RMS-normalised: its state grows with the
    # number of writes, and so does the read's size, past the training lengths on long messages (docs/long_outputs.md)
    "dpfp2-delta-dec-rms-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                            "--fw-delta-norm", "sum", "--fw-output-gate", "rms:decoder", *CONV3]),
    # the sum-normalised delta configuration with the z column: the read divided by the rule's memory of a constant 1
    "dpfp2-deltaz-dec-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta_z",
                                         "--fw-delta-norm", "sum", *CONV3]),
    # the delta configuration with a forget gate (the gated delta rule, L2): every step also decays the whole state
    # by alpha, so in a loop the rest of the memory keeps moving while the repeated pair is rewritten
    "dpfp2-gated-dec-l2-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "gated_delta",
                                           "--fw-delta-norm", "l2", *CONV3]),
    # the gated delta rule with the paper's sum-normalised phi: the forget gate's quality, repeated writes that add
    "dpfp2-gated-dec-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "gated_delta",
                                        "--fw-delta-norm", "sum", *CONV3]),
    # the delta configuration with beta in (0, 2): a write of a pair its key already holds overshoots the value
    # when beta > 1, so a repeated write flips the slot's error instead of fading to nothing
    "dpfp2-delta-dec-l2-bmax2-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                                 "--fw-delta-norm", "l2", "--fw-delta-beta-max", "2", *CONV3]),
    # the delta configuration with beta below 0.1 or 0.02: L2-normalised phi, but a write moves its key's slot at
    # most that share of the way to its value, as sum normalisation's small ||phi(k)||^2 does
    "dpfp2-delta-dec-l2-bmax01-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                                  "--fw-delta-norm", "l2", "--fw-delta-beta-max", "0.1", *CONV3]),
    "dpfp2-delta-dec-l2-bmax002-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                                   "--fw-delta-norm", "l2", "--fw-delta-beta-max", "0.02", *CONV3]),
    # a rule per decoder layer: the sum rule's memory, which adds every write and keeps its count of them in z, in
    # the first decoder layer or in the last, the L2 delta rule in the others (whose translations, in every layer,
    # end early and, on long messages, run away)
    "dpfp2-sum-delta-dec-l2-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule",
                                               lambda layers: ",".join(["sum"] + ["delta"] * (layers - 1)),
                                               "--fw-delta-norm", "l2", *CONV3]),
    "dpfp2-delta-sum-dec-l2-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule",
                                               DELTA_THEN_SUM, "--fw-delta-norm", "l2", *CONV3]),
    # the sum rule in the last decoder layer above the sum-normalised delta rule, plain or with its z column: the
    # last layer's rule decides whether a translation runs away (docs/long_outputs.md)
    "dpfp2-delta-sum-dec-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule",
                                            DELTA_THEN_SUM, "--fw-delta-norm", "sum", *CONV3]),
    "dpfp2-deltaz-sum-dec-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule",
                                             DELTAZ_THEN_SUM, "--fw-delta-norm", "sum", *CONV3]),
    "elu-sum-vconv3": ("fast", ["--fw-feature-map", "elu", *SUM, *CONV3]),
    "hedgehog-sum-vconv3": ("fast", ["--fw-feature-map", "hedgehog", *SUM, *CONV3]),
    # the learned maps of converted softmax models (fw_research.convert.convert_study trains them from scratch too)
    "hedgehog-trainable-sum-vconv3": ("fast", ["--fw-feature-map", "hedgehog", "--fw-hedgehog-trainable", "1",
                                               *SUM, *CONV3]),
    "t2r32-sum-vconv3": ("fast", ["--fw-feature-map", "t2r", "--fw-t2r-features", "32", *SUM, *CONV3]),
    "favor-sum-vconv3": ("fast", ["--fw-feature-map", "favor", *SUM, "--fw-favor-redraw", "batch", *CONV3]),
    "favor-sum-fixed-vconv3": ("fast", ["--fw-feature-map", "favor", *SUM, "--fw-favor-redraw", "never", *CONV3]),
    "dpfp2-sum-softcross-vconv3": ("hybrid", [*DPFP2, *SUM, "--fw-attention", "encoder,decoder", *CONV3]),
    # softmax cross-attention: on a long source it stays on a few positions where the fast weights' read spreads
    # over most of them, and the translations start fewer loops (docs/long_outputs_diagnosis.md)
    "dpfp2-delta-dec-softcross-vconv3": ("hybrid", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                                    "--fw-delta-norm", "sum", "--fw-attention", "encoder,decoder",
                                                    *CONV3]),
    # the delta rule over the source (L2, the default of a delta rule there): the memory the paper's capacity argument
    # (§4.1) favours, against the sum rule's average of a long source; it costs test BLEU (docs/long_outputs.md)
    "dpfp2-delta-cross-l2-vconv3": ("fast", [*DPFP2, *SUM, "--fw-cross-rule", "delta",
                                             "--fw-delta-norm", "l2", *CONV3]),
    # the cross-attention's read weighted towards the source position aligned with the target's (--fw-cross-align P:
    # cos^2P, P = 1 broad, 4 narrower): where a long source's read stops being an average (docs/long_outputs.md)
    "dpfp2-sum-align1-vconv3": ("fast", [*DPFP2, *SUM, "--fw-cross-align", "1", *CONV3]),
    "dpfp2-sum-align4-vconv3": ("fast", [*DPFP2, *SUM, "--fw-cross-align", "4", *CONV3]),
    "dpfp2-delta-dec-align4-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                               "--fw-delta-norm", "sum", "--fw-cross-align", "4", *CONV3]),
    # narrower windows (P = 8: half weight within 0.19 of the source's length, P = 16: 0.13; P = 4: 0.26)
    "dpfp2-delta-dec-align8-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                               "--fw-delta-norm", "sum", "--fw-cross-align", "8", *CONV3]),
    "dpfp2-delta-dec-align16-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                                "--fw-delta-norm", "sum", "--fw-cross-align", "16", *CONV3]),
    # the aligned read below the decoder that starts fewest loops without it (the sum rule last above the
    # sum-normalised delta rule: 4.3% of the long translations loop after 600 updates of the demo preset, softmax 5.3%)
    "dpfp2-delta-sum-dec-align4-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule",
                                                   DELTA_THEN_SUM, "--fw-delta-norm", "sum", "--fw-cross-align", "4",
                                                   *CONV3]),
    # a causal convolution over the decoder's own last 3 values beside its read (--fw-decoder-conv 3): a token repeated
    # after itself reads almost what the first one read from the fast weights, where softmax can read the position
    # before; the convolution hands each position the last values as they are (docs/long_outputs.md)
    "dpfp2-sum-dconv3-vconv3": ("fast", [*DPFP2, *SUM, "--fw-decoder-conv", "3", *CONV3]),
    "dpfp2-delta-dec-dconv3-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                               "--fw-delta-norm", "sum", "--fw-decoder-conv", "3", *CONV3]),
    "dpfp2-delta-dec-align4-dconv3-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule",
                                                      "delta", "--fw-delta-norm", "sum", "--fw-cross-align", "4",
                                                      "--fw-decoder-conv", "3", *CONV3]),
    # the shipped sum rule with both: the aligned read's long-split BLEU, whose runaways the convolution may end
    "dpfp2-sum-align4-dconv3-vconv3": ("fast", [*DPFP2, *SUM, "--fw-cross-align", "4",
                                                "--fw-decoder-conv", "3", *CONV3]),
    # a wider window (5): a loop of subwords such as "@-@ KEY @-@ KEY" repeats with a period above 3
    "dpfp2-delta-dec-align4-dconv5-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule",
                                                      "delta", "--fw-delta-norm", "sum", "--fw-cross-align", "4",
                                                      "--fw-decoder-conv", "5", *CONV3]),
    # no positional embedding in the decoder (--fw-decoder-positions none; the paper's delta-rule language models have
    # none): its fast-weight self-attention orders the target, so a long translation meets no position unseen in
    # training. It lowers the valid loss and costs test BLEU (docs/long_outputs.md)
    "dpfp2-delta-dec-nopos-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                              "--fw-delta-norm", "sum", *NOPOS, *CONV3]),
    "dpfp2-delta-dec-dconv3-nopos-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                                     "--fw-delta-norm", "sum", "--fw-decoder-conv", "3", *NOPOS,
                                                     *CONV3]),
    "dpfp2-sum-dconv3-nopos-vconv3": ("fast", [*DPFP2, *SUM, "--fw-decoder-conv", "3", *NOPOS, *CONV3]),
    "dpfp2-delta-dec-align4-nopos-vconv3": ("fast", [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                                     "--fw-delta-norm", "sum", "--fw-cross-align", "4", *NOPOS,
                                                     *CONV3]),
    **LONG_OUTPUT_ROWS,
}
TRAIN = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr-scheduler", "inverse_sqrt",
         "--clip-norm", "1.0", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
         "--dropout", "0.1"]
# preset -> (BPE merges, architecture flags, optimiser flags), every dimension spelled out (not left to the
# architecture's defaults). `demo` is the demo's model (2+2 layers, 128 dim, 2 heads: d_key 64, FFN 512,
# 2k BPE), about 0.2 s per update on 2 cores; `base` is transformer_fw_small's depth, width and heads with
# half its FFN (3+3 layers, 256 dim, 4 heads: d_key 64, FFN 512, 8k BPE, warm-up 300), about ten times slower.
PRESETS = {
    "demo": (2000, ["--arch", "transformer_fw_small", "--share-all-embeddings",
                    "--encoder-layers", "2", "--decoder-layers", "2",
                    "--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
                    "--encoder-ffn-embed-dim", "512", "--decoder-ffn-embed-dim", "512",
                    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"],
             ["--lr", "2e-3", "--warmup-updates", "200", "--max-tokens", "2048"]),
    "base": (8000, ["--arch", "transformer_fw_small", "--share-all-embeddings",
                    "--encoder-layers", "3", "--decoder-layers", "3",
                    "--encoder-embed-dim", "256", "--decoder-embed-dim", "256",
                    "--encoder-ffn-embed-dim", "512", "--decoder-ffn-embed-dim", "512",
                    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"],
             ["--lr", "1e-3", "--warmup-updates", "300", "--max-tokens", "4096"]),
}


def config_flags(preset, config):
    """A configuration's flags under a preset: a per-layer value (a function of the decoder's layers) spelled out,
    PLAIN_READ where a fast-weight row names no read of the source, and FAVOR_AS_THE_OTHERS's flags that a FAVOR+ row
    does not name."""
    arch = PRESETS[preset][1]
    layers = int(arch[arch.index("--decoder-layers") + 1])
    kind, flags = CONFIGS[config]
    read = PLAIN_READ if kind != "softmax" and "--fw-cross-align" not in flags else []
    favor = [text for flag, value in FAVOR_AS_THE_OTHERS.items() if flag not in flags
             for text in (flag, value)] if "favor" in flags else []
    return [flag(layers) if callable(flag) else flag for flag in flags] + read + favor


def model_flags(preset, config, seed):
    merges, arch, optim = PRESETS[preset]
    # a configuration's flags come last: they may override the preset's (argparse: the last one wins)
    return [*arch, *TRAIN, *optim, *config_flags(preset, config), "--seed", str(seed)]
