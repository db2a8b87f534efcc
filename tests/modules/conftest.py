import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the shared factories.py
