"""The peers' output: records in flashbench's results-file schema (reports/SCHEMA.md), written atomically, with
each finished record appended to <out>.partial.jsonl first; the plan they read (`flashbench plan SPEC.yaml`); the
source commit they are stamped with.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile

from ..problem import UserError, bytes_min, flops, kv_bytes, normalize_problem, problem_key

SCHEMA_VERSION = 1


def repo_root() -> str:
    """The source tree this package lies in (reports/flashbench_reports/peers/ -> the root)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def record(peer: str, p: dict, status: str, reason: str = "", timing: dict = None, check: dict = None,
           seed: int = 0, extra: dict = None, config_str: str = "", rep: tuple = (0, 1)) -> dict:
    """A peer's record ("peer:<name>/<problem>"), or with config_str a catalog variant's through --ours, named as
    flashbench names it ("<variant>/<config>/<problem>"). rep: (repetition_index, repetitions) of --rounds."""
    variant = peer if config_str else "peer:" + peer
    name = "/".join(x for x in (variant, config_str, problem_key(p)) if x)
    # a config named rather than given ("default", "auto": --ours-config) has no key=value pairs until resolved
    config = dict(kv.split("=", 1) for kv in config_str.split(",") if "=" in kv) if config_str else {}
    rec = {"name": name, "run_name": name, "run_type": "iteration", "repetitions": rep[1], "repetition_index": rep[0],
           "threads": 1, "time_unit": "us", "variant": variant, "config": config, "config_str": config_str,
           "problem": {k: v for k, v in p.items() if v or k not in ("kv_lens", "page_size")},
           "status": status, "reason": reason, "flops": flops(p), "bytes_min": bytes_min(p), "bytes_model": None,
           "seed": seed, "counters": None, "counters_reason": "peers.py does not collect counters"}
    rec.update(check or {})
    rec.update(extra or {})
    if status == "ok" and timing:
        med = timing["median_us"]
        rec.update({"iterations": len(timing["samples_us"]), "real_time": med, "cpu_time": med,
                    "tflops": flops(p) / (med * 1e-6) / 1e12, "kv_bytes": kv_bytes(p),
                    "kv_gbps": kv_bytes(p) / (med * 1e-6) / 1e9,
                    "bytes_min_gbps": bytes_min(p) / (med * 1e-6) / 1e9})
        rec.update(timing)
        s = rec["samples_us"]
        if len(s) > 1000:  # keep the file small: evenly spaced subsample
            s = [s[int(i * len(s) / 1000)] for i in range(1000)]
        # to the nanosecond: CUDA events resolve about half a microsecond, so the digits below carry nothing
        rec["samples_us"] = [round(x, 3) for x in s]
    else:
        rec.update({"error_occurred": True, "error_message": reason or status, "iterations": 0, "real_time": 0,
                    "cpu_time": 0, "tflops": None, "median_us": None, "samples_us": []})
    return rec


def write_atomic(path: str, doc: dict) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-peers-")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def append_partial(f, rec: dict) -> None:
    """One record, one line, flushed to the disk: what a killed run leaves (see main)."""
    f.write(json.dumps(rec) + "\n")
    f.flush()
    os.fsync(f.fileno())


def load_plan(path: str, flashbench: str | None = None) -> list:
    """The problems of a plan: a plan.json (`flashbench plan SPEC.yaml > plan.json`), or a spec (.yaml/.yml) planned
    here by the flashbench binary (`flashbench`, else $FB_BUILD/flashbench, else build/flashbench of this tree)."""
    if path.endswith((".yaml", ".yml")):
        return plan_problems(plan_spec_file(path, flashbench), path)
    try:
        with open(path) as f:
            plan = json.load(f)
    except OSError as e:
        raise UserError("cannot read {}: {}; write it with 'flashbench plan SPEC.yaml > plan.json'".format(path, e.strerror))
    except json.JSONDecodeError as e:
        raise UserError("{}:{}:{}: malformed JSON ({}); regenerate it with 'flashbench plan SPEC.yaml > plan.json'"
                        .format(path, e.lineno, e.colno, e.msg))
    return plan_problems(plan, path)


def plan_spec_file(path: str, flashbench: str | None) -> dict:
    """`flashbench plan SPEC`'s JSON; its own error line (a bad spec: exit 2) becomes this UserError."""
    exe = flashbench or os.path.join(os.environ.get("FB_BUILD") or os.path.join(repo_root(), "build"), "flashbench")
    if not os.access(exe, os.X_OK):
        raise UserError("{}: planning a spec needs the flashbench binary, not found at {}; build it "
                        "(scripts/run.sh) or give --flashbench PATH, or give a plan.json".format(path, exe))
    r = subprocess.run([exe, "plan", path], capture_output=True, text=True)
    if r.returncode != 0:
        lines = (r.stderr.strip() or r.stdout.strip() or "exit {}".format(r.returncode)).splitlines()
        raise UserError("{} plan {}: {}".format(exe, path, lines[-1]))
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError as e:
        raise UserError("{} plan {}: output is not JSON ({})".format(exe, path, e.msg))


def plan_problems(plan, path: str) -> list:
    probs = plan.get("problems") if isinstance(plan, dict) else None
    if not isinstance(probs, list) or not all(isinstance(p, dict) for p in probs):
        raise UserError("{}: expected {{\"problems\": [problem objects]}}; regenerate it with "
                        "'flashbench plan SPEC.yaml > plan.json'".format(path))
    out, seen = [], set()
    for p in probs:
        q = normalize_problem(p)
        if problem_key(q) not in seen:
            seen.add(problem_key(q))
            out.append(q)
    spec = plan.get("spec") if isinstance(plan.get("spec"), dict) else None
    timing = plan.get("timing_policy") if isinstance(plan.get("timing_policy"), dict) else {}
    return out, spec, timing


def git_sha() -> str:
    """The source tree's commit, as CMakeLists.txt stamps the harness's results: FLASHBENCH_SOURCE_SHA wins; else git's
    HEAD, with "-dirty" where tracked files differ from it, but only where this checkout is the repository itself. A
    snapshot extracted inside another checkout (a GPU runner's copy) would otherwise be stamped with the enclosing
    repository's HEAD: unknown then (""). A copy of the working tree over an older .git is HEAD-dirty, not HEAD."""
    if os.environ.get("FLASHBENCH_SOURCE_SHA"):
        return os.environ["FLASHBENCH_SOURCE_SHA"].strip()
    root = repo_root()
    try:
        r = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True,
                           timeout=10, cwd=root)
        out = r.stdout.split()
        if r.returncode != 0 or len(out) != 2 or os.path.realpath(out[0]) != os.path.realpath(root):
            return ""
        st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                            text=True, timeout=30, cwd=root)
        return out[1] + ("-dirty" if st.returncode == 0 and st.stdout.strip() else "")
    except Exception:
        return ""
