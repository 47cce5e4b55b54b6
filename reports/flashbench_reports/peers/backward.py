"""The backward's shared pieces: its inputs (Q, K, V and dO; for a catalog variant also O and LSE, from the
reference forward), the reference gradients (autograd of the math attention in float64, or fp32 for large problems,
one (batch, head) and one block of query rows at a time) and the check of a peer's dQ, dK and dV against them.
torch is passed in, never imported here.

The math: P = softmax(scale * Q K^T) over the keys a query sees (bottom-right causal alignment, as the forward's);
O = P V; with dO given, dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = scale * dS K,
dK = scale * dS^T Q. Under GQA dK and dV sum over their group's query heads. A query that sees no key has O = 0,
LSE = -inf and contributes no gradient.
"""
from __future__ import annotations

import math

from ..problem import TOLERANCE

# The check of dQ, dK and dV: atol + rtol * |ref| per element, per input dtype (the one place to re-point at the
# harness's own backward tolerance).
BWD_TOLERANCE = dict(TOLERANCE)
# Problems with more (query, key) pairs than this over all (batch, head)s get an fp32 reference: float64 would take
# minutes on the GPU where fp32 takes seconds, and fp32's error is far inside the fp16/bf16 tolerances.
F64_MAX_PAIRS = 1 << 31
# Bytes of one block of the reference's score matrix (rows x seqlen_kv), which bounds its memory.
REF_BLOCK_BYTES = 256 << 20


def is_bwd(p: dict) -> bool:
    return p.get("pass", "fwd") == "bwd"


class BwdInputs(tuple):
    """A backward problem's inputs: the (q, k, v) tuple as SDPA's [B, H, S, D] views of the problem's layout, with
    .dout (shaped and laid out like Q and O). The reference forward (O, LSE) and the reference gradients are computed
    once, on first use, and shared by every peer of the problem."""

    def setup(self, torch, p: dict, dout):
        self.torch, self.p, self.dout = torch, p, dout
        self._fwd = self._grads = None
        return self

    def forward(self):
        """(O in the problem's dtype and layout as a [B, Hq, Sq, D] view, LSE fp32 [B, Hq, Sq]): what a verified
        forward gives a catalog variant's backward."""
        if self._fwd is None:
            self._fwd = reference_forward(self.torch, self.p, *self)
        return self._fwd

    def reference(self):
        """(dQ, dK, dV) of the reference, in its own dtype (float64 or fp32), as [B, H, S, D]."""
        if self._grads is None:
            self._grads = reference_grads(self.torch, self.p, *self, self.dout)
        return self._grads


def ref_dtype(torch, p: dict):
    pairs = p["batch"] * p["heads_q"] * p["seqlen_q"] * p["seqlen_kv"]
    return torch.float64 if pairs <= F64_MAX_PAIRS else torch.float32


def row_block(p: dict, elem_bytes: int) -> int:
    """Query rows per block of the reference: a few score-sized temporaries of REF_BLOCK_BYTES each."""
    return max(1, min(p["seqlen_q"], REF_BLOCK_BYTES // (elem_bytes * max(1, p["seqlen_kv"]))))


def attend(torch, q, k, v, scale: float, rows: tuple, causal: bool, skv_minus_sq: int):
    """O and LSE of one head for query rows rows[0]..rows[1]-1 (q holds those rows, k and v every key), in q's
    dtype, differentiable in q, k and v. The row maximum is held constant (softmax does not depend on it), so that
    autograd differentiates the softmax itself; a row with no key gives O = 0 and LSE = -inf, and no NaN in the
    gradients (the division is by l clamped to the dtype's smallest normal, where e is all zero)."""
    s = (q @ k.transpose(0, 1)) * scale
    if causal:
        i = torch.arange(rows[0], rows[1], device=q.device)[:, None]
        j = torch.arange(k.shape[0], device=q.device)[None, :]
        s = s.masked_fill(j > i + skv_minus_sq, float("-inf"))
    m = s.detach().amax(dim=1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    l = e.sum(dim=1, keepdim=True)
    o = (e @ v) / l.clamp_min(torch.finfo(q.dtype).tiny)
    lse = torch.where(l[:, 0] > 0, m[:, 0] + torch.log(l[:, 0].clamp_min(torch.finfo(q.dtype).tiny)),
                      torch.full_like(m[:, 0], float("-inf")))
    return o, lse


def _heads(p: dict):
    grp = p["heads_q"] // p["heads_kv"]
    scale = p["scale"] or 1.0 / math.sqrt(p["head_dim"])
    return grp, scale, p["seqlen_kv"] - p["seqlen_q"]


def reference_forward(torch, p: dict, q, k, v, dtype=None):
    """O (the problem's dtype, laid out as the problem's layout, viewed [B, Hq, Sq, D]) and LSE (fp32 [B, Hq, Sq],
    natural log) of the reference, computed in `dtype` (default: ref_dtype)."""
    rd = dtype or ref_dtype(torch, p)
    grp, scale, off = _heads(p)
    B, Hq, Sq, D = p["batch"], p["heads_q"], p["seqlen_q"], p["head_dim"]
    o = (torch.empty(B, Sq, Hq, D, dtype=q.dtype, device=q.device).transpose(1, 2) if p["layout"] == "bshd"
         else torch.empty(B, Hq, Sq, D, dtype=q.dtype, device=q.device))
    lse = torch.empty(B, Hq, Sq, dtype=torch.float32, device=q.device)
    step = row_block(p, torch.finfo(rd).bits // 8)
    with torch.no_grad():
        for b in range(B):
            for h in range(Hq):
                kk, vv = k[b, h // grp].to(rd), v[b, h // grp].to(rd)
                for r0 in range(0, Sq, step):
                    r1 = min(Sq, r0 + step)
                    ob, lb = attend(torch, q[b, h, r0:r1].to(rd), kk, vv, scale, (r0, r1), p["causal"], off)
                    o[b, h, r0:r1] = ob.to(q.dtype)
                    lse[b, h, r0:r1] = lb.float()
    return o, lse


def reference_grads(torch, p: dict, q, k, v, dout, dtype=None):
    """(dQ, dK, dV) of sum(O * dO) by autograd of `attend`, in `dtype` (default: ref_dtype), as [B, H, S, D]."""
    rd = dtype or ref_dtype(torch, p)
    grp, scale, off = _heads(p)
    B, Hq, Hkv, Sq, Skv, D = (p[x] for x in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim"))
    dq = torch.zeros(B, Hq, Sq, D, dtype=rd, device=q.device)
    dk = torch.zeros(B, Hkv, Skv, D, dtype=rd, device=q.device)
    dv = torch.zeros(B, Hkv, Skv, D, dtype=rd, device=q.device)
    step = row_block(p, torch.finfo(rd).bits // 8)
    with torch.enable_grad():
        for b in range(B):
            for h in range(Hq):
                kk = k[b, h // grp].detach().to(rd).requires_grad_()
                vv = v[b, h // grp].detach().to(rd).requires_grad_()
                for r0 in range(0, Sq, step):
                    r1 = min(Sq, r0 + step)
                    qq = q[b, h, r0:r1].detach().to(rd).requires_grad_()
                    o, _ = attend(torch, qq, kk, vv, scale, (r0, r1), p["causal"], off)
                    gq, gk, gv = torch.autograd.grad(o, (qq, kk, vv), dout[b, h, r0:r1].to(rd))
                    dq[b, h, r0:r1] = gq
                    dk[b, h // grp] += gk
                    dv[b, h // grp] += gv
    return dq, dk, dv


def grad_check(torch, p: dict, ref, grads) -> dict:
    """dQ, dK and dV (any dtype, [B, H, S, D]) against the reference gradients: elements beyond
    atol + rtol * |ref| (non-finite ones always) in "_bad", the largest error and the relative L2 error over all
    three, and each gradient's own in grad_errors."""
    atol, rtol = BWD_TOLERANCE[p["dtype"]]
    bad, max_err, num, den, per = 0, 0.0, 0.0, 0.0, {}
    for name, r, g in zip(("dq", "dk", "dv"), ref, grads):
        if tuple(g.shape) != tuple(r.shape):
            raise ValueError("{} has shape {}, expected {}".format(name, tuple(g.shape), tuple(r.shape)))
        g = g.detach().to(r.dtype)
        finite = torch.isfinite(g)
        diff = torch.where(finite, (g - r).abs(), torch.full_like(r, float("inf")))
        n_bad = int((diff > atol + rtol * r.abs()).sum())
        mx = float(diff.max()) if diff.numel() else 0.0
        sq = float((torch.where(finite, diff, torch.zeros_like(diff)) ** 2).sum())
        sq = float("inf") if not bool(finite.all()) else sq
        rr = float((r ** 2).sum())
        per[name] = {"max_error": mx if math.isfinite(mx) else None, "bad": n_bad,
                     "rel_l2_error": (math.sqrt(sq / rr) if rr > 0 else (0.0 if sq == 0 else float("inf")))}
        if not math.isfinite(per[name]["rel_l2_error"]):
            per[name]["rel_l2_error"] = None
        bad, max_err, num, den = bad + n_bad, max(max_err, mx), num + sq, den + rr
    rel_l2 = math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else float("inf"))
    where = "gpu" if ref[0].is_cuda else "cpu"
    return {"max_error": max_err if math.isfinite(max_err) else None,
            "rel_l2_error": rel_l2 if math.isfinite(rel_l2) else None,
            "verified_against": "{}_{}".format(where, "f64" if ref[0].dtype == torch.float64 else "f32"),
            "tolerance": {"atol": atol, "rtol": rtol}, "grad_errors": per, "_bad": bad}


def grads_close(torch, p: dict, a, b) -> bool:
    """Two runs' gradients agree within the check's tolerance (each taken as the other's reference): what a CUDA
    graph's replay must give, where the backward accumulates dQ by atomics and is not bitwise reproducible."""
    atol, rtol = BWD_TOLERANCE[p["dtype"]]
    return all(bool(torch.isfinite(x).all()) and
               bool(((x.float() - y.float()).abs() <= atol + rtol * y.float().abs()).all()) for x, y in zip(a, b))
