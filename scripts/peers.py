#!/usr/bin/env python3
"""peers.py: time torch SDPA (flash, cuDNN, efficient backends) and FlexAttention on flashbench problems, and
optionally a catalog variant through libflashbench_capi.so, and write flashbench results records.

  python3 scripts/peers.py --problems plan.json -o peers.json [--ceilings] [--peers torch_flash,flex]
  python3 scripts/peers.py --help

The code is the package reports/flashbench_reports/peers (timer, backends, C API, CLI; its docstring tells the
method). This script puts reports/ on sys.path first, so that it runs from a plain checkout with nothing
installed, as on a GPU runner without network.
"""
import os
import sys

_REPORTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reports")
if _REPORTS not in sys.path:
    sys.path.insert(0, _REPORTS)

from flashbench_reports.peers.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
