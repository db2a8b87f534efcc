"""Converting a trained softmax Transformer into a fast weight one, and the study that measures it:
`python -m fw_research.convert.<module>`."""
