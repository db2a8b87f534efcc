"""Timing of the ops, reads, training and decoding on CPU and GPU: `python -m fw_research.benchmarks.<module>`.
Their committed results are in benchmarks/results/ (benchmarks/README.md)."""
