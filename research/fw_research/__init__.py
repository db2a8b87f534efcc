"""fw_research: the experiments, benchmarks and tools built on the fw_fairseq plugin.

experiments: the catalog corpus, one model's train-generate-score run, the attention comparison's rows and presets
synthetic:   associative retrieval on the plugin's fast weight ops (paper §6.1)
demo:        the demo, the attention comparison and its diagnosis tools
convert:     turning a softmax checkpoint into a fast weight one
wmt14:       the paper's Table 1: data, training, scoring
benchmarks:  CPU and GPU timing of the ops, reads, training and decoding
gpu_node:    the offline GPU node's kit and check

Every tool runs as `python -m fw_research.<group>.<module>`. The plugin never imports this package, so
`--user-dir fw_fairseq` loads none of it.
"""
