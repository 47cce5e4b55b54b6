#!/usr/bin/env python3
"""peers.py: time torch SDPA (flash, cuDNN, efficient backends), FlexAttention, torch's FP8 SDPA and cuDNN through
its frontend (cudnn_fe, cudnn_fp8; the optional nvidia-cudnn-frontend wheel) on flashbench problems, forward and,
on backward problems (pass: bwd), backward, and optionally a catalog variant through libflashbench_capi.so (a
backward one through fb_capi_launch_backward), and write flashbench results records.

  python3 scripts/peers.py --problems plan.json -o peers.json [--ceilings] [--peers torch_flash,flex]
  python3 scripts/peers.py --problems sweeps/accept/fa2-bwd.yaml -o ab.json --peers torch_flash --ours fa2_bwd
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
