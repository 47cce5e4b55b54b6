"""The paired nightly gate on a GPU: a reference build and a candidate build of flashbench, timed on the same GPU
in one process, interleaved sample by sample (Timer.measure_many over both builds' libflashbench_capi.so), as
Chromium's Pinpoint and Google Benchmark's two-binary compare do. Host-to-host drift cancels: both sides ran on
the same machine, within a sample of each other.

  python scripts/nightly_paired.py --ref REF_DIR --cand CAND_DIR --spec sweeps/nightly.yaml -o paired.json
      [--test-slowdown VARIANT:FRACTION] [--attempts 3] [--min-time 0.2] [--timeout 1.0]
  python scripts/nightly_paired.py table RUN.json...   (per run: machine, flagged, false regressions, missed)

REF_DIR and CAND_DIR each hold a build's `flashbench` and `libflashbench_capi.so`. The candidate's `flashbench`
gives the points (`plan` for the problems, `run --dry-run` for variant/config/problem and plan-time skips).

Per point: inputs once; the candidate's output checked against the float64 reference (a point that fails is "now
failing"); both builds' calls captured in CUDA graphs where possible; then attempts of an interleaved loop, the
order swapped each attempt (R C R C ..., then C R C R ...) so neither side always goes first. After each attempt
the paired verdict (paired.decide) is taken over all pairs so far; a point that is still "unknown" (noisy, or
beyond the floor without significance) gets another attempt with twice the sampling time, up to --attempts, then
stays "unknown": never a regression on its own.

--test-slowdown VARIANT:FRACTION is test-only: each candidate sample of VARIANT gets a GPU spin (torch.cuda._sleep)
after the call, calibrated on the point so that the sample takes (1 + FRACTION) x as long (the spin's own launch
gap counts, as in the harness's FLASHBENCH_TEST_SLOWDOWN). It is written into the output's context.

The output is a results file of the candidate side (reports/SCHEMA.md; `history ingest` reads it), each record with
a `paired` object (reference median, change, interval, t, p-values, attempts, verdict, and `sources`: whether the
variant's kernel sources differ between the builds, from each build's `flashbench list --json`), and the context
carries both builds' ids and per-variant source hashes, the machine (GPU UUID, host id, ...) and the gate's
settings. The summary says of each flagged point whether its variant's sources changed, so a slowdown with the
same kernel sources points at the harness, the build options or the toolkit. Exit 0: no regression; 1: a
regression or a point that now fails; 2: a user error.
"""
from __future__ import annotations

import argparse
import datetime as dt
import dataclasses
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

from . import paired as PG
from . import stats as S
from .problem import UserError, normalize_problem, problem_key
from .results import SOURCES_NOTE, sources_verdict

MAX_TABLE_NAME = 110


# ---- the points, from the candidate's flashbench (CPU) ----

_RUN_LINE = re.compile(r"^\s+(run|skip)\s+(\S+)/(\S*)/(\S+)\s")


def parse_dry_run(text: str) -> List[Tuple[str, str, str, str]]:
    """[(run | skip, variant, config_str, problem_key)] from `flashbench run --dry-run` output."""
    out = []
    for line in text.splitlines():
        m = _RUN_LINE.match(line)
        if m:
            out.append(m.groups())
    return out


def plan_points(flashbench: str, spec: str) -> Tuple[List[dict], dict]:
    """The spec's points to time, each {variant, config_str, problem}, and the spec's timing policy."""
    def call(args):
        r = subprocess.run([flashbench] + args, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise UserError("{} {}: exit {}: {}".format(flashbench, " ".join(args), r.returncode,
                                                        (r.stderr.strip().splitlines() or [""])[-1]))
        return r.stdout
    plan = json.loads(call(["plan", spec]))
    problems = {problem_key(normalize_problem(p)): normalize_problem(p) for p in plan.get("problems", [])}
    points = []
    for what, variant, cfg, key in parse_dry_run(call(["run", "--dry-run", spec])):
        if what == "run" and key in problems:
            points.append({"variant": variant, "config_str": cfg, "problem": problems[key]})
    if not points:
        raise UserError("{}: no point to run on this GPU (see '{} run --dry-run {}')".format(spec, flashbench, spec))
    return points, plan.get("timing_policy") or {}


def variant_sources(build_dir: str) -> Optional[Dict[str, str]]:
    """Each variant's kernel-source hash in the build in build_dir (its `flashbench list --json`), or None where that
    cannot be read (no binary there, or one from before the hashes were listed)."""
    try:
        r = subprocess.run([os.path.join(build_dir, "flashbench"), "list", "--json"], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            return None
        hashes = {v["name"]: v.get("source_hash") or "" for v in json.loads(r.stdout)}
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return None
    return hashes if any(hashes.values()) else None


def parse_slowdown(text: Optional[str]) -> Optional[Tuple[str, float]]:
    if not text:
        return None
    variant, _, frac = text.partition(":")
    try:
        f = float(frac)
    except ValueError:
        f = float("nan")
    if not variant or not (0 < f <= 1):
        raise UserError("--test-slowdown {}: give VARIANT:FRACTION, e.g. fa2_q_outer:0.03 for 3% slower".format(text))
    return variant, f


# ---- the machine (nvidia-smi in this process; no CUDA context needed) ----

SMI_FIELDS = ("uuid", "serial", "pci.bus_id", "driver_version", "vbios_version", "enforced.power.limit",
              "ecc.mode.current", "clocks.sm", "clocks.mem", "temperature.gpu", "power.draw")


def _num(x: str) -> Optional[float]:
    try:
        return float(x)
    except ValueError:
        return None


def machine_state(index: int) -> dict:
    got = _smi(index, ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw"))
    return {"sm_clock_mhz": _num(got.get("clocks.sm", "")), "mem_clock_mhz": _num(got.get("clocks.mem", "")),
            "temperature_c": _num(got.get("temperature.gpu", "")), "power_w": _num(got.get("power.draw", ""))}


def _smi(index: int, fields) -> Dict[str, str]:
    try:
        out = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=" + ",".join(fields),
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
        vals = [v.strip() for v in out.strip().split(",")]
        return {f: v for f, v in zip(fields, vals) if v and not v.startswith("[")}
    except Exception:
        return {}


def read_host_id(root: str = "/") -> Tuple[Optional[str], Optional[str]]:
    """(id, source) as the harness's read_host_id (machine.cpp): etc/machine-id, else the kernel's boot id."""
    for rel, src in (("etc/machine-id", "machine-id"), ("proc/sys/kernel/random/boot_id", "boot-id")):
        try:
            with open(os.path.join(root, rel)) as f:
                v = f.readline().strip()
            if v:
                return v, src
        except OSError:
            pass
    return None, None


def machine_identity(index: int) -> dict:
    got = _smi(index, SMI_FIELDS)
    host_id, src = read_host_id()
    ecc = got.get("ecc.mode.current", "").lower()
    return {"host_id": host_id, "host_id_source": src, "host_name": socket.gethostname(),
            "gpu_uuid": got.get("uuid"), "gpu_serial": got.get("serial"), "pci_bus_id": got.get("pci.bus_id"),
            "driver": got.get("driver_version"), "vbios": got.get("vbios_version"),
            "power_limit_w": _num(got.get("enforced.power.limit", "")),
            "ecc": {"enabled": "on", "disabled": "off"}.get(ecc), "source": "nvidia-smi" if got else "none",
            "reason": None if got else "nvidia-smi gave nothing", "start": machine_state(index), "end": None}


# ---- timing (GPU) ----

def calibrate_spin(torch, timer, fn, fraction: float) -> Tuple[int, dict]:
    """torch.cuda._sleep cycles that make fn's cold sample (1 + fraction) x as long; the same rule as the harness
    (options.cpp, slowdown_spin_ns): the spin's launch gap counts towards the fraction."""
    def cold_us(f, n=7):
        out = []
        for _ in range(n):
            timer.flush()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            f()
            e.record()
            e.synchronize()
            out.append(s.elapsed_time(e) * 1e3)
        return S.median(out)
    base = cold_us(fn)
    probe = 1_000_000
    with0 = cold_us(lambda: (fn(), torch.cuda._sleep(0)))
    with_probe = cold_us(lambda: (fn(), torch.cuda._sleep(probe)))
    overhead = max(0.0, with0 - base)
    us_per_cycle = max(1e-9, (with_probe - with0) / probe)
    extra_us = fraction * base - overhead
    cycles = int(extra_us / us_per_cycle) if extra_us > 0 else 0
    return cycles, {"fraction": fraction, "calibration_base_us": base, "spin_overhead_us": overhead,
                    "spin_cycles": cycles, "expected_fraction": (overhead + cycles * us_per_cycle) / base}


def time_point(torch, timer_for, ref_fn, cand_fn, attempts: int, floor: float, alpha: float, t_min: float,
               noise_target: float) -> Tuple[PG.PairedVerdict, List[float], List[float], int]:
    ref_all, cand_all = [], []
    v = None
    for k in range(attempts):
        timer = timer_for(k)
        if k % 2 == 0:
            r, c = timer.measure_many([ref_fn, cand_fn])
        else:
            c, r = timer.measure_many([cand_fn, ref_fn])
        n = min(len(r["samples_us"]), len(c["samples_us"]))
        ref_all += r["samples_us"][:n]
        cand_all += c["samples_us"][:n]
        v = PG.decide(ref_all, cand_all, floor, alpha, t_min, noise_target)
        if not PG.needs_more(v):
            return v, ref_all, cand_all, k + 1
    return v, ref_all, cand_all, attempts


def run(args) -> int:
    from .peers import CapiLib, Ours, Timer, prepare_peer, record, timing_args
    from .peers.backends import make_inputs
    from .peers.device import device_info
    slow = parse_slowdown(args.test_slowdown)
    libs = {}
    for side, d in (("reference", args.ref), ("candidate", args.cand)):
        so = os.path.join(d, "libflashbench_capi.so")
        if not os.path.exists(so):
            raise UserError("--{} {}: no libflashbench_capi.so there; give a build folder (cmake --build B --target "
                            "flashbench flashbench_capi)".format(side[:3] if side == "reference" else "cand", d))
        libs[side] = so
    fb = os.path.join(args.cand, "flashbench")
    points, plan_timing = plan_points(fb, args.spec)
    if args.limit:
        points = points[:args.limit]
    try:
        import torch
    except ImportError:
        raise UserError("torch is not importable here; the paired gate times through torch (pip install torch)")
    if not torch.cuda.is_available():
        raise UserError("no CUDA device: the paired gate needs a GPU")
    ref_lib, cand_lib = CapiLib(libs["reference"]), CapiLib(libs["candidate"])
    sources = {"reference": variant_sources(args.ref), "candidate": variant_sources(args.cand)}
    dev = device_info(torch)
    idx = torch.cuda.current_device()
    machine = machine_identity(idx)
    l2 = dev.get("l2_bytes") or 50 * 1024 * 1024

    def timer_for(attempt: int):
        scale = 2 ** attempt
        return Timer(torch, timing_args(plan_timing, min_time=args.min_time * scale, timeout=args.timeout * scale,
                                        max_noise=args.max_noise, settle=0.0), l2, max_mhz=dev.get("sm_clock_max_mhz") or 0)

    records, t0 = [], time.time()
    print("paired gate: {} points of {} on {} ({}), reference {} vs candidate {}{}".format(
        len(points), args.spec, dev["name"], machine.get("gpu_uuid") or "?", args.ref, args.cand,
        "; test slowdown {}:{}".format(*slow) if slow else ""), flush=True)
    for i, pt in enumerate(points):
        p, variant, cfg = pt["problem"], pt["variant"], pt["config_str"]
        name = "{}/{}/{}".format(variant, cfg, problem_key(p))
        ref = Ours(torch, ref_lib, variant, cfg, p)
        cand = Ours(torch, cand_lib, variant, cfg, p)
        try:
            inputs = make_inputs(torch, p, args.seed, "cuda")
        except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
            # torch reports an allocation that fails inside a kernel (randn) as a plain accelerator error
            if "out of memory" not in str(e).lower():
                raise
            torch.cuda.empty_cache()
            inputs = None
        rec_c, ready_c = prepare_peer(torch, cand, inputs, args.seed, verify=not args.no_verify)
        rec_r, ready_r = prepare_peer(torch, ref, inputs, args.seed, verify=False)
        if rec_c is not None or rec_r is not None:
            rec = rec_c or record(variant, p, "skipped", "the reference build cannot run it: " + rec_r["reason"],
                                  config_str=cfg, seed=args.seed)
            rec["paired"] = {"verdict": "now failing" if rec["status"] in ("incorrect", "crashed") else "skipped"}
            records.append(rec)
        else:
            ref_fn, cand_fn = ready_r[0], ready_c[0]
            extra = {}
            if slow and slow[0] == variant:
                cycles, extra = calibrate_spin(torch, timer_for(0), cand_fn, slow[1])
                inner = cand_fn
                cand_fn = lambda: (inner(), torch.cuda._sleep(cycles))
            try:
                v, rs, cs, n_att = time_point(torch, timer_for, ref_fn, cand_fn, args.attempts, args.floor,
                                              args.alpha, args.min_t, args.noise_target)
                if v.verdict in ("regression", "improvement"):
                    # Two libraries hold two sets of buffers, and where they land can move a memory-bound kernel
                    # by a few percent in a steady way (seen: the same build, naive on decode, +2.7% at t = 33).
                    # So a change must show again with fresh launchers (new workspaces) and the order reversed.
                    for pe in (ref, cand):
                        pe.close()
                    ref = Ours(torch, ref_lib, variant, cfg, p)
                    cand = Ours(torch, cand_lib, variant, cfg, p)
                    _, again_r = prepare_peer(torch, ref, inputs, args.seed, verify=False)
                    _, again_c = prepare_peer(torch, cand, inputs, args.seed, verify=False)
                    if again_r and again_c:
                        fn_c = again_c[0]
                        if slow and slow[0] == variant:
                            fn_c = (lambda f: lambda: (f(), torch.cuda._sleep(cycles)))(fn_c)
                        c2, r2 = timer_for(0).measure_many([fn_c, again_r[0]])
                        n2 = min(len(r2["samples_us"]), len(c2["samples_us"]))
                        v2 = PG.decide(r2["samples_us"][:n2], c2["samples_us"][:n2], args.floor, args.alpha,
                                       args.min_t, args.noise_target)
                        if v2.verdict != v.verdict:
                            v = dataclasses.replace(v, verdict="unknown", why="{} ({:+.2%}) not confirmed with fresh "
                                                    "buffers and the order reversed ({}, {:+.2%})".format(
                                                        v.verdict, v.change or 0.0, v2.verdict, v2.change or 0.0))
                        else:
                            v = dataclasses.replace(v, why="{}; confirmed with fresh buffers, order reversed "
                                                    "({:+.2%})".format(v.why, v2.change or 0.0))
                        n_att += 1
                timing = {"samples_us": cs, "dropped_throttled": 0, "stop_reason": "paired", "noisy":
                          v.verdict == "unknown"}
                timing.update({k: v2 for k, v2 in _summary(cs).items()})
                rec = record(variant, p, "ok", "", timing, ready_c[1], args.seed, config_str=cfg)
                rec["paired"] = dict(v.as_dict(), attempts=n_att, reference_samples_us=_thin(rs))
                rec["samples_us"] = _thin(cs)
                if extra:
                    rec["test_slowdown"] = extra
            except Exception as e:
                rec = record(variant, p, "crashed", "{}: {}".format(type(e).__name__, str(e)[:200]), config_str=cfg)
                rec["paired"] = {"verdict": "now failing"}
        for pe in (ref, cand):
            pe.close()
        del inputs
        # The two libraries allocate their workspaces with cudaMalloc, outside torch's cache: give back what the
        # cache holds, or a large point leaves the next one no room.
        torch.cuda.empty_cache()
        rec["paired"]["sources"] = sources_verdict(variant, sources["reference"], sources["candidate"])
        records.append(rec)
        pv = rec["paired"]
        print("  [{}/{}] {:<13} {:+7.2f}%  {}".format(
            i + 1, len(points), pv["verdict"], 100 * (pv.get("change") or 0.0), name[:MAX_TABLE_NAME]), flush=True)
    machine["end"] = machine_state(idx)
    wall = time.time() - t0
    context = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "host_name": socket.gethostname(), "executable": "scripts/nightly_paired.py", "schema_version": 1,
               "library_build_type": "release",
               "flashbench": {"version": "paired-gate", "git_sha": _build_id(args.cand)},
               "spec": {"name": os.path.splitext(os.path.basename(args.spec))[0], "path": args.spec},
               "device": dev, "machine": machine, "timing_policy": dict(plan_timing, min_time_s=args.min_time,
                                                                         timeout_s=args.timeout),
               "paired_gate": {"reference": {"dir": os.path.abspath(args.ref), "build_id": _build_id(args.ref),
                                             "variant_sources": sources["reference"]},
                               "candidate": {"dir": os.path.abspath(args.cand), "build_id": _build_id(args.cand),
                                             "variant_sources": sources["candidate"]},
                               "floor": args.floor, "alpha": args.alpha, "min_t": args.min_t,
                               "noise_target": args.noise_target, "attempts": args.attempts, "wall_s": wall,
                               "test_slowdown": {"variant": slow[0], "fraction": slow[1]} if slow else None},
               "ceilings": None}
    doc = {"context": context, "benchmarks": records}
    tmp = args.output + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, args.output)
    print(render_summary(doc))
    return exit_code(records)


def _thin(xs: List[float], keep: int = 1000) -> List[float]:
    return xs if len(xs) <= keep else [xs[int(i * len(xs) / keep)] for i in range(keep)]


def _summary(xs: List[float]) -> dict:
    from .peers.timer import summarize
    return summarize(xs) if xs else {"median_us": None}


def _build_id(d: str) -> Optional[str]:
    """The build's id from BUILD_ID in its folder (scripts/nightly.sh writes it: the commit it was built at)."""
    try:
        with open(os.path.join(d, "BUILD_ID")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def verdicts(records: List[dict]) -> Dict[str, List[str]]:
    out: Dict[str, List[str]] = {}
    for r in records:
        out.setdefault((r.get("paired") or {}).get("verdict", "?"), []).append(r["name"])
    return out


def _flag_line(kind: str, r: dict) -> str:
    note = SOURCES_NOTE.get((r.get("paired") or {}).get("sources", "unknown"))
    line = "  {:<12} {}".format(kind, r["name"])
    return line + " ({})".format(note) if note and kind != "unknown" else line


def exit_code(records: List[dict]) -> int:
    v = verdicts(records)
    return 1 if v.get("regression") or v.get("now failing") else 0


def render_summary(doc: dict) -> str:
    by_kind: Dict[str, List[dict]] = {}
    for r in doc["benchmarks"]:
        by_kind.setdefault((r.get("paired") or {}).get("verdict", "?"), []).append(r)
    g = doc["context"]["paired_gate"]
    out = ["paired gate: {} ({:.0f} s): ".format("FAIL" if exit_code(doc["benchmarks"]) else "PASS", g["wall_s"]) +
           ", ".join("{} {}".format(len(rs), k) for k, rs in sorted(by_kind.items()))]
    for kind in ("regression", "now failing", "unknown", "improvement"):
        out += [_flag_line(kind, r) for r in by_kind.get(kind, [])]
    return "\n".join(out)


def acceptance_table(paths: List[str]) -> Tuple[str, int]:
    """The gate's own check over several paired runs: per run its machine, the slowed variant (if any), the points
    flagged, and the false regressions (flagged points of another variant; with no slowdown, any flagged point) and
    misses (points of the slowed variant not flagged). Returns (Markdown table, total false regressions + misses)."""
    rows = ["| run | machine (GPU UUID / host id) | slowdown | points | flagged | false regressions | missed | "
            "unknown | wall s |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    bad = 0
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        ctx, recs = doc["context"], doc["benchmarks"]
        g = ctx.get("paired_gate") or {}
        slow = g.get("test_slowdown") or {}
        sv = slow.get("variant")
        m = ctx.get("machine") or {}
        timed = [r for r in recs if (r.get("paired") or {}).get("verdict") not in (None, "skipped")]
        flagged = [r for r in timed if r["paired"]["verdict"] in ("regression", "now failing")]
        false = [r for r in flagged if r.get("variant") != sv]
        missed = [r for r in timed if sv and r.get("variant") == sv and r["paired"]["verdict"] != "regression"]
        unknown = [r for r in timed if r["paired"]["verdict"] == "unknown"]
        bad += len(false) + len(missed)
        rows.append("| {} | {} / {} | {} | {} | {} | {} | {} | {} | {:.0f} |".format(
            os.path.basename(path), (m.get("gpu_uuid") or "?")[-12:], (m.get("host_id") or "?")[:12],
            "{}:{}".format(sv, slow.get("fraction")) if sv else "none", len(timed), len(flagged), len(false),
            len(missed), len(unknown), g.get("wall_s") or 0))
    return "\n".join(rows), bad


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="nightly_paired.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, help="reference build folder (flashbench, libflashbench_capi.so)")
    ap.add_argument("--cand", required=True, help="candidate build folder")
    ap.add_argument("--spec", default="sweeps/nightly.yaml")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--attempts", type=int, default=3, help="attempts for a point still unknown (default 3)")
    ap.add_argument("--min-time", type=float, default=0.2, help="GPU seconds a side, first attempt (doubles)")
    ap.add_argument("--timeout", type=float, default=1.0, help="wall seconds of a loop, first attempt (doubles)")
    ap.add_argument("--max-noise", type=float, default=0.005, help="each side's stopping rule: relative stdev")
    ap.add_argument("--floor", type=float, default=S.FLOOR)
    ap.add_argument("--alpha", type=float, default=S.ALPHA)
    ap.add_argument("--min-t", type=float, default=S.T_MIN)
    ap.add_argument("--noise-target", type=float, default=PG.NOISE_TARGET)
    ap.add_argument("--test-slowdown", metavar="VARIANT:FRACTION", help="test only: slow the candidate's VARIANT")
    ap.add_argument("--no-verify", action="store_true", help="skip the candidate's check against float64")
    ap.add_argument("--limit", type=int, default=0, help="time only the first N points")
    ap.add_argument("--seed", type=int, default=1)
    return ap


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["table"]:
        if len(argv) < 2:
            sys.stderr.write("nightly_paired.py: error: table needs paired results files, e.g. OUT/*.json\n")
            return 2
        text, bad = acceptance_table(argv[1:])
        print(text)
        return 1 if bad else 0
    args = build_parser().parse_args(argv)
    try:
        if args.attempts < 1 or args.min_time <= 0 or args.timeout <= 0:
            raise UserError("--attempts, --min-time and --timeout must be positive")
        return run(args)
    except UserError as e:
        sys.stderr.write("nightly_paired.py: error: {}\n".format(e))
        return 2
