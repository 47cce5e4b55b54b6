"""A numpy (float64) model of fa3_fp8's quantization error on the FlashAttention-3 paper's outlier inputs, split by
source: Q and K's e4m3 codes (per 128-token block, with or without the random-sign Hadamard rotation), V's codes (one
descale per head), and P's e4m3 rounding (scaled by 2^8). No GPU; it says which part of the error the rotation can reach
(fa3_fp8's HISTORY compares it with `flashbench fp8-error` on an H100).

    python3 tools/dev/fp8_error_model.py [--n 2048 4096 8192] [--seed 1]
"""
import argparse

import numpy as np


def e4m3(x):
    """Round to the nearest e4m3 value (3 mantissa bits, subnormals below 2^-6, saturating at 448)."""
    ax = np.abs(x)
    e = np.maximum(np.floor(np.log2(np.maximum(ax, 1e-30))), -6)
    step = 2.0 ** (e - 3)
    return np.sign(x) * np.minimum(np.round(ax / step) * step, 448.0)


def quantize(x, block):
    """Dequantized per-block codes: one descale (amax / 448) per `block` rows."""
    out = np.empty_like(x)
    for t in range(0, x.shape[0], block):
        b = x[t:t + block]
        ds = max(np.abs(b).max(), 1e-30) / 448
        out[t:t + block] = e4m3(b / ds) * ds
    return out


def rotation(d, rng):
    """M = H diag(s) / sqrt(d), applied to rows as x @ M.T (signs first, then the Hadamard transform)."""
    h = np.array([[1.0]])
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h @ np.diag(rng.choice([-1.0, 1.0], d)) / np.sqrt(d)


def attention(q, k, v, round_p):
    s = q @ k.T / np.sqrt(q.shape[1])
    p = np.exp(s - s.max(1, keepdims=True))
    l = p.sum(1, keepdims=True)
    if round_p:  # the kernel rounds 2^8 P to e4m3 for P V; l sums the unrounded P
        p = e4m3(p * 256) / 256
    return p @ v / l


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4, help="independent heads, their squared errors averaged")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print("RMSE of O against float64 attention of the originals; %d heads, N(0,1) + N(0,10^2)*Bernoulli(0.001)" %
          args.heads)
    print("%6s %10s %10s %10s %7s %7s | rotated: %9s %9s %9s" % (
        "N", "tensor", "block", "rotated", "blk/rot", "ten/rot", "QK only", "V only", "P only"))
    for n in args.n:
        def draw():
            x = rng.standard_normal((n, args.d))
            x += rng.standard_normal((n, args.d)) * 10 * (rng.random((n, args.d)) < 1e-3)
            return x.astype(np.float32).astype(np.float64)

        # squared errors: block, rotated, the rotated case's QK, V and P parts alone, and per-tensor Q and K (the
        # FlashAttention-3 paper's baseline)
        sq = np.zeros(6)
        for _ in range(args.heads):
            q, k, v = draw(), draw(), draw()
            ref = attention(q, k, v, False)
            m = rotation(args.d, rng)
            vq = quantize(v, n)  # V: one descale per head, never rotated
            qb, kb = quantize(q, 128), quantize(k, 128)
            qr, kr = quantize(q @ m.T, 128), quantize(k @ m.T, 128)
            outs = (attention(qb, kb, vq, True), attention(qr, kr, vq, True), attention(qr, kr, v, False),
                    attention(q, k, vq, False), attention(q, k, v, True),
                    attention(quantize(q, n), quantize(k, n), vq, True))
            sq += [np.mean((o - ref) ** 2) for o in outs]
        e = np.sqrt(sq / args.heads)
        print("%6d %10.3e %10.3e %10.3e %7.2f %7.2f | %18.3e %9.3e %9.3e" % (
            n, e[5], e[0], e[1], e[0] / e[1], e[5] / e[1], e[2], e[3], e[4]))

if __name__ == "__main__":
    main()
