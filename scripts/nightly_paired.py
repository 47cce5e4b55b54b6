#!/usr/bin/env python3
"""The paired nightly gate (reports/flashbench_reports/gate.py): a reference and a candidate build timed on one GPU,
interleaved sample by sample. Runs from a plain checkout: reports/ goes on sys.path, nothing is installed."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reports"))
from flashbench_reports.gate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
