"""Run one fairseq CLI in this process and record its peak CUDA memory (bench_fairseq_gpu.py's runner).

    python3 benchmarks/fairseq_run.py PEAK_JSON {preprocess,train,generate} [fairseq arguments ...]

The fairseq entry points are called as their console scripts would call them, so the node needs no
installed scripts (the kit installs fairseq with `pip --target`). PEAK_JSON receives
{"peak_MiB": ...}: the CUDA caching allocator's high-water mark over the whole run (null on a CPU).
"""
import importlib
import json
import sys

import torch

ENTRY = {"preprocess": "fairseq_cli.preprocess", "train": "fairseq_cli.train", "generate": "fairseq_cli.generate"}


def main():
    if len(sys.argv) < 3 or sys.argv[2] not in ENTRY:
        raise SystemExit(f"usage: fairseq_run.py PEAK_JSON {{{','.join(ENTRY)}}} [fairseq arguments ...]")
    peak_file, command = sys.argv[1], sys.argv[2]
    sys.argv = [f"fairseq-{command}", *sys.argv[3:]]
    try:
        importlib.import_module(ENTRY[command]).cli_main()
    finally:
        peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
        with open(peak_file, "w") as f:
            json.dump({"peak_MiB": peak}, f)


if __name__ == "__main__":
    main()
