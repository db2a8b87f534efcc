"""The corpus builders and run helpers that the scripts (scripts/), the benchmarks (benchmarks/), the GPU node's
tools (tools/gpu_node/) and the tests share: the catalog corpus, one model's train-generate-score run and how its
translations go wrong in length, the attention comparison's rows and presets, the fused read benchmark's cases.

It sits above the models and tasks: it drives them through fairseq's CLIs or imports fw_fairseq.ops, and the
plugin itself (models, modules, ops, tasks) never imports it, so `--user-dir fw_fairseq` loads none of it.
"""
