#!/usr/bin/env python3
"""summary.py: the main job's closing summary of a flashbench results file.

  python3 scripts/summary.py RESULTS.json

One row per problem shape, one column per variant: the best rate over the variant's configs and its share of the
ceiling measured on this GPU (context.ceilings). A shape is compute-bound when its arithmetic intensity (FLOPs per
byte of bytes_min: Q, K, V read once, O and LSE written once) is at least the device's ridge point, GEMM TFLOP/s over
copy GB/s; its rate is then TFLOP/s against the bf16 GEMM ceiling (e4m3 against gemm_e4m3_tflops where the file has
it). Below the ridge it is memory-bound and the rate is GB/s of bytes_min against the device copy. Then the points
that were not ok: failures one line each, skips counted by reason.

Standard library only, so that it runs on a GPU runner where nothing can be installed. Exit status: 0, or 2 when
the file cannot be read.
"""
import collections
import json
import sys

FAILED = ("incorrect", "crashed", "timeout")


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        return fail("summary: cannot read {}: {}; give a results file written by flashbench run".format(path, e))
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        return fail("summary: {} has no 'benchmarks' list; give a results file written by flashbench run".format(path))
    return doc


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(2)


def status(r):
    return r.get("status") or ("crashed" if r.get("error_occurred") else "ok")


def shape(p):
    s = "b{} h{}/{} q{} kv{} d{}".format(p.get("batch"), p.get("heads_q"), p.get("heads_kv"), p.get("seqlen_q"),
                                         p.get("seqlen_kv"), p.get("head_dim"))
    if p.get("page_size"):
        s += " page{}".format(p["page_size"])
    if p.get("kv_lens"):
        s += " varlen"
    # A backward point is its own row: the forward's and the backward's rates of one shape never share a cell.
    return s + (" causal" if p.get("causal") else "") + " " + str(p.get("dtype")) + (
        " bwd" if p.get("pass") == "bwd" else "")


def median_us(r):
    m = r.get("median_us")
    if m is None and r.get("real_time"):
        m = r["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}.get(r.get("time_unit", "us"), 1.0)
    return m if m and m > 0 else None


def tflops(r):
    if r.get("tflops"):
        return r["tflops"]
    m = median_us(r)
    return r["flops"] / (m * 1e-6) / 1e12 if m and r.get("flops") else None


def gbps(r):
    if r.get("bytes_min_gbps"):
        return r["bytes_min_gbps"]
    m = median_us(r)
    return r["bytes_min"] / (m * 1e-6) / 1e9 if m and r.get("bytes_min") else None


def positive(c, key):
    v = (c or {}).get(key)
    return v if isinstance(v, (int, float)) and v > 0 else None


def summarize(doc, out=sys.stdout):
    ctx = doc.get("context") or {}
    recs = [r for r in doc["benchmarks"] if r.get("run_type", "iteration") != "aggregate"]
    ceil = ctx.get("ceilings") or {}
    gemm, copy, gemm8 = positive(ceil, "gemm_bf16_tflops"), positive(ceil, "copy_gbps"), positive(ceil, "gemm_e4m3_tflops")
    ridge = gemm * 1e12 / (copy * 1e9) if gemm and copy else None
    dev = (ctx.get("device") or {}).get("name", "unknown device")
    print("summary of {} points on {} (spec {})".format(len(recs), dev, (ctx.get("spec") or {}).get("name", "?")),
          file=out)
    if ctx.get("fake_worker"):
        print("fake worker: the times are simulated (a test of the engine), not measurements", file=out)
    if ridge:
        print("ceilings measured: bf16 GEMM {:.0f} TFLOP/s, copy {:.0f} GB/s; ridge {:.0f} FLOP/B{}".format(
            gemm, copy, ridge, ", e4m3 GEMM {:.0f} TFLOP/s".format(gemm8) if gemm8 else ""), file=out)
        print("compute-bound shapes (T): best TFLOP/s and % of the GEMM ceiling; memory-bound (G): best GB/s of "
              "bytes_min and % of the copy", file=out)
    else:
        print("no ceilings in this file (measured unless --no-ceilings): best TFLOP/s for every shape, no %", file=out)

    variants, shapes = [], collections.OrderedDict()
    cells = collections.defaultdict(list)
    for r in recs:
        v, p = r.get("variant") or r["name"].split("/")[0], r.get("problem") or {}
        if v not in variants:
            variants.append(v)
        k = shape(p)
        shapes.setdefault(k, r)
        cells[(k, v)].append(r)

    def bound(r):
        if not ridge or not r.get("flops") or not r.get("bytes_min"):
            return "T"
        return "T" if r["flops"] / r["bytes_min"] >= ridge else "G"

    def cell(k, v, kind):
        rs = cells.get((k, v), [])
        ok = [r for r in rs if status(r) == "ok"]
        if not ok:
            if any(status(r) in FAILED for r in rs):
                return "FAIL"
            return "skip" if rs else "-"
        if kind == "G":
            best = max(x for x in (gbps(r) for r in ok) if x is not None) if any(gbps(r) for r in ok) else None
            roof = copy
        else:
            best = max(x for x in (tflops(r) for r in ok) if x is not None) if any(tflops(r) for r in ok) else None
            e4m3 = (ok[0].get("problem") or {}).get("dtype") == "e4m3"
            roof = gemm8 if e4m3 else gemm
            if e4m3 and not gemm8:
                roof = None
        if best is None:
            return "?"
        s = "{:.0f}".format(best) if best >= 10 else "{:.2f}".format(best)
        if roof:
            s += " {:.0f}%".format(100.0 * best / roof)
        failed = sum(status(r) in FAILED for r in rs)
        return s + ("!" if failed else "")

    width = max([len(k) for k in shapes] + [5]) + 2
    cw = max([len(v) for v in variants] + [10]) + 2
    print("", file=out)
    print("shape".ljust(width) + "T/G" + "".join(v.rjust(cw) for v in variants), file=out)
    any_e4m3_no_roof = False
    for k, first in shapes.items():
        kind = bound(first)
        any_e4m3_no_roof |= kind == "T" and (first.get("problem") or {}).get("dtype") == "e4m3" and not gemm8 and bool(ridge)
        print(k.ljust(width) + " " + kind + " " + "".join(cell(k, v, kind).rjust(cw) for v in variants), file=out)
    if any_e4m3_no_roof:
        print("e4m3 rows: no % (this file has no e4m3 GEMM ceiling; the bf16 one is not the fp8 roof)", file=out)

    counts = collections.Counter(status(r) for r in recs)
    print("", file=out)
    print("points: " + ", ".join("{} {}".format(n, s) for s, n in sorted(counts.items())) +
          ("; '!' marks a best of the other configs where some config failed" if any(
              status(r) in FAILED for r in recs) else ""), file=out)
    bad = [r for r in recs if status(r) in FAILED]
    for r in bad[:20]:
        print("  {}: {}: {}".format(status(r), r["name"], (r.get("reason") or r.get("error_message") or "")[:160]),
              file=out)
    if len(bad) > 20:
        print("  ... and {} more not-ok points (see the results file)".format(len(bad) - 20), file=out)
    skips = collections.Counter((r.get("variant") or r["name"].split("/")[0], (r.get("reason") or "")[:100])
                                for r in recs if status(r) == "skipped")
    for (v, why), n in sorted(skips.items()):
        print("  skipped {:3d} {}: {}".format(n, v, why), file=out)
    return 0


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) == 2 else 2
    return summarize(load(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
