#!/usr/bin/env python3
"""decode_table.py: the flash-decoding table (K+V GB/s, ours vs torch SDPA's cuDNN and flash backends).

  python3 scripts/decode_table.py OURS.json PEERS.json [TUNE.json]

Prints one line per problem of OURS (status, median µs, kv GB/s, the peers' kv GB/s, ours/cuDNN), then, from
TUNE.json, kv GB/s per (problem, config). Standard library only.
"""
import json
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f).get("benchmarks", [])
    except (OSError, ValueError) as e:
        print("decode_table: cannot read {}: {}".format(path, e))
        return []


def kv_bytes(p):
    el = 4 if p.get("dtype") == "fp32" else 2
    keys = sum(p["kv_lens"]) if p.get("kv_lens") else p["batch"] * p["seqlen_kv"]
    return 2.0 * el * keys * p["heads_kv"] * p["head_dim"]


def gbps(r):
    if r.get("status") != "ok" or not r.get("median_us"):
        return None
    return r.get("kv_gbps") or kv_bytes(r["problem"]) / (r["median_us"] * 1e-6) / 1e9


def fmt(x, w=7, d=0):
    return ("{:%d.%df}" % (w, d)).format(x) if isinstance(x, (int, float)) else "{:>{w}}".format("-", w=w)


def main(argv):
    ours = load(argv[1]) if len(argv) > 1 else []
    peers = load(argv[2]) if len(argv) > 2 else []
    tune = load(argv[3]) if len(argv) > 3 else []
    by_key = {}
    for r in peers:
        by_key.setdefault(r["name"].split("/")[-1], {})[r["variant"]] = r
    print("{:<58} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6}".format(
        "problem", "status", "us", "ours", "cudnn", "flash", "x_cdnn"))
    for r in ours:
        k = r["name"].split("/")[-1]
        pk = by_key.get(k, {})
        g, c, f = gbps(r), gbps(pk.get("peer:torch_cudnn", {})), gbps(pk.get("peer:torch_flash", {}))
        print("{:<58} {:>9} {} {} {} {} {}".format(
            k[:58], r.get("status"), fmt(r.get("median_us"), 8, 1), fmt(g, 8), fmt(c, 8), fmt(f, 8),
            fmt(g / c if g and c else None, 6, 2)))
        if r.get("status") not in ("ok", None):
            print("    reason: " + str(r.get("reason"))[:200])
    if tune:
        print("\ntune: kv GB/s per config")
        cfgs = []
        for r in tune:
            if r["config_str"] not in cfgs:
                cfgs.append(r["config_str"])
        keys = []
        for r in tune:
            k = r["name"].split("/")[-1]
            if k not in keys:
                keys.append(k)
        cell = {(r["name"].split("/")[-1], r["config_str"]): r for r in tune}
        for i, c in enumerate(cfgs):
            print("  c{} = {}".format(i, c))
        print("{:<44}".format("problem") + "".join("{:>7}".format("c%d" % i) for i in range(len(cfgs))))
        for k in keys:
            row = "{:<44}".format(k[:44])
            for c in cfgs:
                r = cell.get((k, c), {})
                row += fmt(gbps(r), 7) if r.get("status") == "ok" else "{:>7}".format((r.get("status") or "-")[:6])
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
