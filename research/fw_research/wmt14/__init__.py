"""The paper's Table 1 on WMT14 En-De: download, preparation, checkpoint averaging, scoring and the table:
`python -m fw_research.wmt14.<module>`, which scripts/wmt14/{train,evaluate,table1}.sh call."""
