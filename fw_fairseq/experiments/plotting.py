"""pyplot for the figures the experiment scripts write, set up once: files only, and quiet in a log.

Importing fairseq may leave the root logger at DEBUG (its text-to-speech tasks call logging.basicConfig at import);
matplotlib's import and font lookup then flood the log, so its logger is quietened before the import.
"""
import logging

logging.getLogger("matplotlib").setLevel(logging.WARNING)

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt  # noqa: E402, F401  (what the figure modules import from here)
