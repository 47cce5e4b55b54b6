#!/usr/bin/env python3
"""Regenerates reports/examples/ from real results files, and the headless-Chromium screenshots of its pages.

    scripts/make_examples.py --quick results/nvidia-h200/quick.json [peers.json ...] \
        --bringup h100/nvidia-h100-80gb-hbm3.json h200/nvidia-h200.json [--history nightly.sqlite] [--out reports/examples]

writes (each folder replaced whole, figures linked rather than inlined so the PNGs are reviewable in git):
  OUT/<gpu>-quick/            flashbench-report html of the --quick files (one section per GPU if several)
  OUT/bringup-<gpuA>-<gpuB>/  flashbench-report bringup A B (B's speed-up over A, explained by the ceilings)
  OUT/history/                flashbench-report history plot of --history (omitted without it)
  OUT/screenshots/{html,bringup,history}.png   full-page screenshots (Chromium; skipped with a message if absent)
<gpu> is the device slug without its vendor prefix and memory suffix (nvidia-h100-80gb-hbm3 -> h100).
Exit 2 with one line on bad input, before anything is written.
"""
import argparse
import os
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "reports"))

from flashbench_reports import bringup, history, page, report  # noqa: E402
from flashbench_reports import results as R  # noqa: E402


def short_name(res: R.Results) -> str:
    slug = str(res.device.get("slug") or res.device.get("name") or "gpu").lower()
    m = re.match(r"(?:nvidia-)?([a-z]+\d+[a-z]*)", slug)
    return m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", slug).strip("-") or "gpu"


def fresh(path: str) -> str:
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", nargs="+", required=True, metavar="JSON", help="results files for the html example")
    ap.add_argument("--bringup", nargs=2, required=True, metavar=("A", "B"), help="results of GPU A and GPU B")
    ap.add_argument("--history", metavar="DB", help="history database (flashbench-report history ingest)")
    ap.add_argument("--out", default=os.path.join(ROOT, "reports", "examples"), help="default: reports/examples")
    ap.add_argument("--no-screenshots", action="store_true")
    a = ap.parse_args(argv)
    try:
        quick = [R.load(p) for p in a.quick]
        groups = report.group_by_device(quick)
        ra, rb = R.load(a.bringup[0]), R.load(a.bringup[1])
        if a.history and not os.path.isfile(a.history):
            raise R.UserError("--history {}: no such file; pass a database written by 'flashbench-report history "
                              "ingest'".format(a.history))
    except R.UserError as e:
        print("make_examples: error: {}".format(e), file=sys.stderr)
        return 2
    names = "-".join(short_name(g[0]) for g in groups)
    pages = {}
    d = fresh(os.path.join(a.out, "{}-quick".format(names)))
    pages["html"] = report.build(a.quick, d, embed=False)
    d = fresh(os.path.join(a.out, "bringup-{}-{}".format(short_name(ra), short_name(rb))))
    pages["bringup"] = bringup.build(a.bringup[0], a.bringup[1], d, embed=False)
    if a.history:
        d = fresh(os.path.join(a.out, "history"))
        pages["history"] = history.plot(a.history, d, None, 0.02, 0.05, 24, embed=False)
    for p in pages.values():
        print(p)
    if a.no_screenshots:
        return 0
    if page.find_chromium() is None:
        print("make_examples: chromium not found (apt-get install -y chromium); no screenshots taken", file=sys.stderr)
        return 0
    shots = fresh(os.path.join(a.out, "screenshots"))
    for name, html in pages.items():
        png = os.path.join(shots, name + ".png")
        info = page.screenshot(html, png)
        print("{}: {} px high, {} images loaded{}".format(png, info["height"], info["images"],
                                                         ", cut at {} px".format(page.MAX_SCREENSHOT_HEIGHT)
                                                         if info["truncated"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
