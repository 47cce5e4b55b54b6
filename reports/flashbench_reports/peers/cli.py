"""scripts/peers.py's command line."""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import socket
import sys

from . import __doc__ as DOC
from ..problem import UserError, problem_key
from .backends import PEERS, make_peer
from .capi import CapiLib, Ours, best_configs
from .device import device_info, measure_ceilings
from .records import SCHEMA_VERSION, append_partial, git_sha, load_plan, repo_root, write_atomic
from .runner import run_problem
from .timer import TIMING_FIELDS, Nvml, Timer, resolve_timing


def check_output(path: str) -> None:
    """-o before any measurement: a folder, or a place where no file can be made, fails now, not after the run.
    A missing parent directory is created (as peers.py always did)."""
    if os.path.isdir(path):
        raise UserError("-o {}: is a directory; give a file name in it, e.g. -o {}".format(
            path, os.path.join(path, "peers.json")))
    d = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(d):
        d = os.path.dirname(d)
    if not os.path.isdir(d) or not os.access(d, os.W_OK | os.X_OK):
        raise UserError("-o {}: cannot create files in {}; choose a writable directory".format(path, d))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", required=True, metavar="PLAN.json|SPEC.yaml",
                    help="the problems: a plan.json ({\"problems\": [...]}, from `flashbench plan SPEC.yaml`), or a "
                         "spec, planned here by the flashbench binary (--flashbench)")
    ap.add_argument("--flashbench", default=None, metavar="PATH",
                    help="the flashbench binary that plans a spec (default: $FB_BUILD/flashbench, else build/)")
    ap.add_argument("-o", "--out", required=True, help="results JSON to write")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of " + ",".join(PEERS))
    ap.add_argument("--ceilings", action="store_true", help="also measure bf16 GEMM 8192³ and copy bandwidth")
    # Timing: the plan's timing_policy (what `flashbench run` of the same spec uses), unless given here
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--min-samples", type=int, default=None)
    ap.add_argument("--max-samples", type=int, default=None)
    ap.add_argument("--min-time", type=float, default=None, help="seconds of GPU time summed over the samples")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per point (wall)")
    ap.add_argument("--max-noise", type=float, default=None, help="relative stdev target")
    ap.add_argument("--settle", type=float, default=None, help="seconds to wait for power/thermal slowdown to clear")
    ap.add_argument("--warm", dest="cold", action="store_const", const=False, default=None,
                    help="do not flush L2 before each sample")
    ap.add_argument("--queue", choices=("round_trip", "back_to_back"), default=None,
                    help="the timed loop's load (timing.hpp): the plan's timing.queue unless given")
    ap.add_argument("--flush", choices=("read", "write"), default=None,
                    help="L2 flush: read a 2x-L2 buffer (clean lines, default) or write it (as do_bench)")
    ap.add_argument("--ours", default=None, metavar="VARIANT|auto",
                    help="also time this catalog variant here, through libflashbench_capi.so, with the same timer "
                         "and interleaved with the peers, at --ours-config or --ours-best (default: each "
                         "problem's default config); "
                         "auto: the library's own choice per problem, as flashbench::attention_forward makes it; "
                         "a backward variant (e.g. fa2_bwd) on the plan's backward problems (pass: bwd)")
    ap.add_argument("--ours-config", default=None, help="--ours's config on every problem: name=value,... | default")
    ap.add_argument("--ours-best", default=None, metavar="RESULTS",
                    help="--ours's config per problem: its fastest verified one in this `flashbench run` results file")
    ap.add_argument("--lib", default=None, help="libflashbench_capi.so (default: $FB_BUILD or build/, beside "
                                                  "scripts/)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time each problem's peers this many times in turn (records carry repetition_index)")
    ap.add_argument("--ours-top", type=int, default=1, metavar="K",
                    help="with --ours-best: time the K fastest configs per problem (by their fastest sample), each "
                         "as its own entry; scripts/peer_table.py picks among them on the first round")
    ap.add_argument("--interleave", choices=("round", "sample"), default="round",
                    help="with several peers (or --ours): time them one after another in each round (round), or "
                         "all in one timed loop, sample by sample in turn (sample: each sample within a sample of "
                         "the others', so a power phase falls on all of them alike)")
    ap.add_argument("--eager", dest="graph", action="store_false",
                    help="time the eager calls, not their CUDA-graph replay (the host may then fall behind the GPU)")
    ap.add_argument("--no-verify", dest="verify", action="store_false")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    try:
        unknown = [x for x in peers if x not in PEERS]
        if unknown:
            raise UserError("--peers: unknown {}; choose from {}".format(",".join(unknown), ",".join(PEERS)))
        problems, plan_spec, plan_timing = load_plan(args.problems, args.flashbench)
        resolve_timing(args, plan_timing)
        if args.rounds < 1:
            raise UserError("--rounds {}: give 1 or more".format(args.rounds))
        if args.ours_top < 1 or (args.ours_top > 1 and not args.ours_best):
            raise UserError("--ours-top {}: give 1 or more, with --ours-best RESULTS".format(args.ours_top))
        ours_configs = None
        if args.ours == "auto":
            # The library's own choice per problem (tuning table, else heuristic): it picks the config too.
            if args.ours_best is not None or args.ours_config not in (None, "auto", "default"):
                raise UserError("--ours auto picks the config too (the GPU's tuning table, else the heuristic): "
                                "give neither --ours-config nor --ours-best")
            ours_configs = {problem_key(p): ["auto"] for p in problems}
        elif args.ours:
            if args.ours_config is not None and args.ours_best is not None:
                raise UserError("--ours {}: give one of --ours-config CONFIG and --ours-best RESULTS".format(args.ours))
            if args.ours_config is None and args.ours_best is None:
                args.ours_config = "default"  # each problem's default config, recorded as such
            ours_configs = (best_configs(args.ours_best, args.ours, args.ours_top) if args.ours_best
                            else {problem_key(p): [args.ours_config] for p in problems})
        elif args.ours_config or args.ours_best:
            raise UserError("--ours-config and --ours-best need --ours VARIANT")
        check_output(args.out)
    except UserError as e:
        print("peers.py: error: {}".format(e), file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("peers.py: torch is not installed; no peer results written")
        return 0
    if not torch.cuda.is_available():
        print("peers.py: no CUDA device visible to torch {}; no peer results written".format(torch.__version__))
        return 0

    lib = None
    if args.ours:
        try:
            lib = CapiLib(args.lib or os.path.join(os.environ.get("FB_BUILD") or os.path.join(
                repo_root(), "build"), "libflashbench_capi.so"))
        except UserError as e:
            print("peers.py: error: {}".format(e), file=sys.stderr)
            return 2
    dev = device_info(torch)
    timer = Timer(torch, args, dev.get("l2_bytes") or (64 << 20), Nvml(dev.get("pci_bus_id"), torch.cuda.current_device()),
                  dev.get("sm_clock_max_mhz") or 0)
    ctx = {"date": dt.datetime.now(dt.timezone.utc).astimezone().isoformat(timespec="seconds"),
           "host_name": socket.gethostname(), "executable": os.path.abspath(sys.argv[0] or "peers.py"),
           "num_cpus": os.cpu_count(),
           "mhz_per_cpu": 0, "cpu_scaling_enabled": False, "caches": [],
           "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else [],
           "library_build_type": "release", "schema_version": SCHEMA_VERSION,
           "flashbench": {"version": "peers.py", "git_sha": git_sha(), "build_type": "python " + platform.python_version()},
           "spec": plan_spec or {"name": os.path.splitext(os.path.basename(args.problems))[0], "path": args.problems},
           "device": dev, "ceilings": measure_ceilings(torch, args) if args.ceilings else None,
           "timing_policy": dict({f: getattr(args, n) for n, (f, _) in TIMING_FIELDS.items()}, timer="cuda_events"),
           "rounds": args.rounds, "interleave": args.interleave,
           "ours": {"variant": args.ours, "lib": lib.path, "build": lib.build,
                    "configs": ("the library's choice per problem (tuning table, else heuristic)" if args.ours == "auto"
                                else args.ours_config
                                or "the {} fastest by min_us in {}".format(args.ours_top, args.ours_best))}
                   if lib else None}
    records = []
    # As `flashbench run` does: every finished record goes to <out>.partial.jsonl at once, so that a run cut short
    # (a call's time limit, a hung backend) keeps what it measured; the final file replaces it.
    partial_path = args.out + ".partial.jsonl"
    os.makedirs(os.path.dirname(os.path.abspath(partial_path)), exist_ok=True)
    partial = open(partial_path, "w")
    for i, p in enumerate(problems):
        bound = [make_peer(torch, peer, p) for peer in peers]
        if lib:
            bound[:0] = [Ours(torch, lib, args.ours, c, p) for c in ours_configs.get(problem_key(p)) or [None]]
        for rec in run_problem(torch, timer, bound, p, args.seed + i, args.verify, args.rounds, args.graph,
                               args.interleave):
            records.append(rec)
            append_partial(partial, rec)
            print("{:<9} {:<18} {}".format(rec["status"], rec["variant"], rec["name"].split("/")[-1]) +
                  ("  {:.1f} TFLOP/s".format(rec["tflops"]) if rec.get("tflops") else "  " + rec["reason"]) +
                  ("  (round {})".format(rec["repetition_index"]) if args.rounds > 1 else ""), flush=True)
        torch.cuda.empty_cache()
    write_atomic(args.out, {"context": ctx, "benchmarks": records})
    partial.close()
    os.remove(partial_path)
    print("wrote {} records to {}".format(len(records), args.out))
    return 0
