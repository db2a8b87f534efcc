"""The suite's process-wide settings. The `slow` and `e2e` markers (below). And, without a GPU, Triton kernels (the
fused read, fw_fairseq/ops/fused_read/) run under Triton's interpreter on CPU tensors, so their parity tests run here
as they do compiled on a GPU; that must be set before Triton decorates a kernel, i.e. before
fw_fairseq.ops.fused_read's kernels are first imported."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# Markers: `pytest -m "not slow"` is the quick loop; `make test` runs everything. The long tests are marked here by
# where they live, so that a new test in one of these places is marked without remembering to.
import pathlib  # noqa: E402

import pytest  # noqa: E402

TESTS = pathlib.Path(__file__).resolve().parent
MARKED = {  # a folder or file under tests/ -> its markers
    "e2e": ("slow", "e2e"),  # the real fairseq CLIs on a tiny corpus
    "lm/test_lm_cli.py": ("slow", "e2e"),
    "scripts/test_table1_rehearsal.py": ("slow", "e2e"),  # scripts/wmt14/table1.sh with every row at tiny dims
    "scripts/test_train_eval.py": ("slow", "e2e"),  # train.sh, evaluate.sh, table1.py through the real tools
    "demo": ("slow",),  # the demo's corpus from the machine's catalogs
}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes seconds to minutes; leave out with -m 'not slow'")
    config.addinivalue_line("markers", "e2e: end to end through the real fairseq CLIs or the repository's scripts")


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            relative = pathlib.Path(str(item.fspath)).resolve().relative_to(TESTS).as_posix()
        except ValueError:
            continue
        for place, names in MARKED.items():
            if relative == place or relative.startswith(place + "/"):
                for name in names:
                    item.add_marker(getattr(pytest.mark, name))
