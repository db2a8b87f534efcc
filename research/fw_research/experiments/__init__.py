"""The corpus builders and model runs that the demo, the comparison, the benchmarks, the GPU node's tools and the
tests share: the catalog corpus, one model's train-generate-score run and how its translations go wrong in length,
the attention comparison's rows and presets, the fused read benchmark's cases.

It sits above the plugin: it drives the models through fairseq's CLIs or imports fw_fairseq.ops, and the plugin
(models, modules, ops, tasks) never imports it, so `--user-dir fw_fairseq` loads none of it.
"""
