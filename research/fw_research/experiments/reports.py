"""What the experiment scripts' tables and figures share: pyplot set up once (files only, quiet in a log), and the
mean over seeds of a column where some runs have no value.

Importing fairseq may leave the root logger at DEBUG (its text-to-speech tasks call logging.basicConfig at import);
matplotlib's import and font lookup then flood the log, so its logger is quietened before the import.
"""
import logging
import statistics

logging.getLogger("matplotlib").setLevel(logging.WARNING)

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt  # noqa: E402, F401  (what the figure modules import from here)


def mean(values):
    """The mean of the values that are not None; None when there are none (a column no run measured)."""
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None
