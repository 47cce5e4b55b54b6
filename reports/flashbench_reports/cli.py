"""flashbench-report: html | compare | bringup | history {ingest,plot}.

Exit codes: 0 ok; 1 compare found a regression or a point that now fails; 2 a user error (one line on
stderr: what, where, what to do) and no output file written; 3 compare could give no verdict: the two files come
from different hosts and no history (--history) supplies the spread between runs, so a change beyond the floor
needs a paired run (scripts/nightly.sh).
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .results import UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: one line, exit 2 (argparse also uses 2)
        sys.stderr.write("flashbench-report: {}; see 'flashbench-report --help'\n".format(message))
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="flashbench-report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    h = sub.add_parser("html", help="HTML report (index.html, figures/, summary.md) from results files")
    h.add_argument("results", nargs="+", help="results JSON files (e.g. a sweep plus peers.json); files of different "
                                              "GPUs get one section each, and files whose GPU cannot be told are "
                                              "refused")
    h.add_argument("-o", "--out", required=True, help="output directory")
    h.add_argument("--link-figures", action="store_true", help="link figures/*.png instead of inlining them")

    c = sub.add_parser("compare", help="noise-aware per-point comparison; exits 1 on a regression, 3 when only a "
                       "paired run can decide")
    c.add_argument("baseline")
    c.add_argument("current")
    c.add_argument("--threshold", type=float, default=0.02, help="relative slowdown to care about (default 0.02)")
    c.add_argument("--alpha", type=float, default=0.05, help="Mann-Whitney U significance level (default 0.05)")
    c.add_argument("--min-z", type=float, default=7.0,
                   help="a change must be this many between-run standard deviations clear of zero (default 7)")
    c.add_argument("--history", metavar="DB",
                   help="history database: use the between-run spread learned there for this GPU model and point")
    c.add_argument("-o", "--out", help="also write the Markdown table here")

    b = sub.add_parser("bringup", help="same points on two GPUs: each speed-up against the ratio of the GPUs' "
                                       "measured ceilings (GEMM for compute-bound points, copy for memory-bound)")
    b.add_argument("a", help="results file of GPU A (the reference)")
    b.add_argument("b", help="results file of GPU B (speed-ups are B over A)")
    b.add_argument("-o", "--out", required=True, help="output directory")
    b.add_argument("--tolerance", type=float, default=0.9,
                   help="flag points whose speed-up is below this fraction of the predicted one (default 0.9)")
    b.add_argument("--link-figures", action="store_true")

    hi = sub.add_parser("history", help="SQLite history of runs and trend plots")
    hs = hi.add_subparsers(dest="hcmd", required=True, parser_class=_Parser)
    ing = hs.add_parser("ingest", help="add a results file to the history database")
    ing.add_argument("results")
    ing.add_argument("--db", required=True)
    ing.add_argument("--git-sha", help="override context.flashbench.git_sha")
    pl = hs.add_parser("plot", help="trend plots per point with detected changes marked")
    pl.add_argument("--db", required=True)
    pl.add_argument("-o", "--out", required=True)
    pl.add_argument("--point", help="point name (exact, else substring)")
    pl.add_argument("--threshold", type=float, default=0.02)
    pl.add_argument("--alpha", type=float, default=0.05)
    pl.add_argument("--max-points", type=int, default=24)
    pl.add_argument("--link-figures", action="store_true")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "compare":
            from . import compare
            return compare.run(args.baseline, args.current, args.threshold, args.alpha, args.out, args.min_z,
                               args.history)
        if args.cmd == "html":
            from . import report
            print(report.build(args.results, args.out, embed=not args.link_figures))
            return 0
        if args.cmd == "bringup":
            from . import bringup
            print(bringup.build(args.a, args.b, args.out, embed=not args.link_figures, tolerance=args.tolerance))
            return 0
        if args.cmd == "history":
            from . import history
            if args.hcmd == "ingest":
                return history.ingest(args.results, args.db, args.git_sha)
            print(history.plot(args.db, args.out, args.point, args.threshold, args.alpha, args.max_points,
                               embed=not args.link_figures))
            return 0
    except UserError as e:
        sys.stderr.write("flashbench-report: error: {}\n".format(e))
        return 2
    except OSError as e:
        sys.stderr.write("flashbench-report: error: {}: {}; check the path and permissions\n".format(
            getattr(e, "filename", "") or "output", e.strerror or e))
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
