"""The demo, the attention comparison and the tools that diagnose its translations:
`python -m fw_research.demo.<module>`."""
