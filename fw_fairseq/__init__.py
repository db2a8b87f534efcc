"""fw_fairseq: fast weight programmers as a fairseq plugin (--user-dir fw_fairseq)."""
