"""The backward's shared pieces: its inputs (Q, K, V and dO; O and LSE from the reference forward), the reference
gradients and the check of a peer's dQ, dK and dV against them, with the harness's bound. torch is passed in, never
imported here. A peer whose backward reads O of its own forward (torch's autograd, cudnn_fe) is checked against the
reference gradients of that O (BwdInputs.reference(o)); a catalog variant reads the reference forward's O.

The reference follows the harness's (harness/include/flashbench/reference.hpp): from Q, K, V, dO, O (the reference
forward's, rounded to the problem's dtype, as a catalog variant reads it) and LSE (fp32), under the forward's mask
(bottom-right causal): P = exp(scale * Q K^T - LSE), D = rowsum(dO * O), dV = P^T dO, dP = dO V^T,
dS = P * (dP - D), dQ = scale * dS K, dK = scale * dS^T Q; under GQA dK and dV sum over their group's query heads;
a row that sees no key (LSE = -inf) adds nothing. Beside each element it sums the absolute values of its terms
(abs) and of the unrounded factor over the unmasked terms (floor), which scale a low-precision kernel's rounding
error. It runs where the inputs are (the GPU), one (batch, head) and one block of query rows at a time, in float64,
or fp32 for large problems.
"""
from __future__ import annotations

import math

# The gradients' bound, the harness's (verify.cpp, grad_tolerance_for; docs/measurement.md's table), with u the
# dtype's unit roundoff: |got - ref| <= atol + rtol * |ref| + term * abs + floor * floor_sum per element, every
# element finite, and per tensor ||got - ref|| / ||ref|| <= rel_l2.
_U = {"bf16": 2.0 ** -9, "fp16": 2.0 ** -11, "fp32": 2.0 ** -24}
GRAD_TOLERANCE = {
    "bf16": {"atol": 2.0 ** -16, "rtol": 2 * _U["bf16"], "term": 4 * _U["bf16"], "floor": 0.0,
             "rel_l2": 8 * _U["bf16"]},
    "fp16": {"atol": 2.0 ** -16, "rtol": 2 * _U["fp16"], "term": 4 * _U["fp16"], "floor": 2.0 ** -24,
             "rel_l2": 8 * _U["fp16"]},
    "fp32": {"atol": 2.0 ** -16, "rtol": 2 * _U["fp32"], "term": 2.0 ** -14, "floor": 0.0, "rel_l2": 2.0 ** -14},
}
# Problems with more (query, key) pairs than this over all (batch, head)s get an fp32 reference: float64 would take
# minutes on the GPU where fp32 takes seconds, and fp32's error is far inside the fp16/bf16 bounds.
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

    def reference(self, o=None):
        """The reference gradients (GradReference) of these inputs, with LSE of forward() and O of forward(), or
        `o`: the O that a peer's backward reads (its own forward's). A backward computes D = rowsum(dO * O) from
        the O it is given, so O rounded otherwise than the reference's (a flash forward rounds P before P V)
        changes dS = P (dP - D) by about an ulp of O in every term of a row, which the bound, scaled by the terms'
        own sizes, does not cover where a row has few keys (a causal mask's first rows); compared with the
        gradients of the O it read, a backward carries its own rounding only. The LSE stays the reference's: a
        peer's differs by fp32 rounding, far inside the bound."""
        ref_o = self.forward()[0]
        if o is None or o is ref_o or (tuple(o.shape) == tuple(ref_o.shape) and bool(self.torch.equal(o, ref_o))):
            if self._grads is None:
                self._grads = reference_grads(self.torch, self.p, *self, self.dout, *self.forward())
            return self._grads
        return reference_grads(self.torch, self.p, *self, self.dout, o.detach(), self.forward()[1])


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
    """O (q's dtype, laid out as the problem's layout, viewed [B, Hq, Sq, D]) and LSE (fp32 [B, Hq, Sq], natural
    log; float64 for float64 inputs) of the reference, computed in `dtype` (default: ref_dtype)."""
    rd = dtype or ref_dtype(torch, p)
    grp, scale, off = _heads(p)
    B, Hq, Sq, D = p["batch"], p["heads_q"], p["seqlen_q"], p["head_dim"]
    o = (torch.empty(B, Sq, Hq, D, dtype=q.dtype, device=q.device).transpose(1, 2) if p["layout"] == "bshd"
         else torch.empty(B, Hq, Sq, D, dtype=q.dtype, device=q.device))
    # fp32, as kernels read it (float64 where the inputs are, in the tests' exact checks)
    lse = torch.empty(B, Hq, Sq, dtype=torch.promote_types(q.dtype, torch.float32), device=q.device)
    step = row_block(p, torch.finfo(rd).bits // 8)
    with torch.no_grad():
        for b in range(B):
            for h in range(Hq):
                kk, vv = k[b, h // grp].to(rd), v[b, h // grp].to(rd)
                for r0 in range(0, Sq, step):
                    r1 = min(Sq, r0 + step)
                    ob, lb = attend(torch, q[b, h, r0:r1].to(rd), kk, vv, scale, (r0, r1), p["causal"], off)
                    o[b, h, r0:r1] = ob.to(q.dtype)
                    lse[b, h, r0:r1] = lb.to(lse.dtype)
    return o, lse


class GradReference(tuple):
    """(dQ, dK, dV) of the reference as [B, H, S, D] in its dtype, with .abs and .floor (the same shapes; floor only
    where the bound uses it, fp16, else None)."""


def reference_grads(torch, p: dict, q, k, v, dout, o=None, lse=None, dtype=None):
    """The reference gradients (GradReference) of sum(O * dO), from O and LSE as given (default: reference_forward's
    in q's dtype), computed in `dtype` (default: ref_dtype)."""
    rd = dtype or ref_dtype(torch, p)
    if o is None or lse is None:
        o, lse = reference_forward(torch, p, q, k, v)
    grp, scale, off = _heads(p)
    B, Hq, Hkv, Sq, Skv, D = (p[x] for x in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim"))
    z = lambda h, s: torch.zeros(B, h, s, D, dtype=rd, device=q.device)
    dq, dk, dv = z(Hq, Sq), z(Hkv, Skv), z(Hkv, Skv)
    aq, ak, av = z(Hq, Sq), z(Hkv, Skv), z(Hkv, Skv)
    floor = GRAD_TOLERANCE.get(p["dtype"], {}).get("floor", 0.0) > 0
    fq, fk, fv = (z(Hq, Sq), z(Hkv, Skv), z(Hkv, Skv)) if floor else (None, None, None)
    step = row_block(p, torch.finfo(rd).bits // 8)
    j = torch.arange(Skv, device=q.device)[None, :]
    with torch.no_grad():
        for b in range(B):
            for h in range(Hq):
                g = h // grp
                kk, vv = k[b, g].to(rd), v[b, g].to(rd)
                for r0 in range(0, Sq, step):
                    r1 = min(Sq, r0 + step)
                    qq, oo, dd = q[b, h, r0:r1].to(rd), o[b, h, r0:r1].to(rd), dout[b, h, r0:r1].to(rd)
                    ll = lse[b, h, r0:r1].to(rd)[:, None]
                    seen = torch.isfinite(ll).expand(r1 - r0, Skv)  # a row with LSE = -inf sees no key
                    if p["causal"]:
                        i = torch.arange(r0, r1, device=q.device)[:, None]
                        seen = seen & (j <= i + off)
                    s = (qq @ kk.T) * scale - torch.where(torch.isfinite(ll), ll, torch.zeros_like(ll))
                    pm = torch.where(seen, torch.exp(s), torch.zeros_like(s))
                    ds = pm * (dd @ vv.T - (dd * oo).sum(dim=1, keepdim=True))
                    dq[b, h, r0:r1] = scale * (ds @ kk)
                    dk[b, g] += scale * (ds.T @ qq)
                    dv[b, g] += pm.T @ dd
                    ads = ds.abs()
                    aq[b, h, r0:r1] = scale * (ads @ kk.abs())
                    ak[b, g] += scale * (ads.T @ qq.abs())
                    av[b, g] += pm.T @ dd.abs()
                    if floor:
                        m = seen.to(rd)
                        fq[b, h, r0:r1] = scale * (m @ kk.abs())
                        fk[b, g] += scale * (m.T @ qq.abs())
                        fv[b, g] += m.T @ dd.abs()
    out = GradReference((dq, dk, dv))
    out.abs, out.floor = (aq, ak, av), (fq, fk, fv) if floor else None
    return out


def grad_check(torch, p: dict, ref, grads) -> dict:
    """dQ, dK and dV (any dtype, [B, H, S, D]) against the reference (GradReference) with the harness's bound:
    elements beyond it (non-finite ones always) and each tensor whose relative L2 error exceeds rel_l2 count in
    "_bad"; the largest error, the relative L2 error over all three and each gradient's own (grad_errors)."""
    tol = GRAD_TOLERANCE[p["dtype"]]
    bad, max_err, num, den, per = 0, 0.0, 0.0, 0.0, {}
    floors = ref.floor or (None, None, None)
    for name, r, a, fl, g in zip(("dq", "dk", "dv"), ref, ref.abs, floors, grads):
        if tuple(g.shape) != tuple(r.shape):
            raise ValueError("{} has shape {}, expected {}".format(name, tuple(g.shape), tuple(r.shape)))
        g = g.detach().to(r.dtype)
        finite = torch.isfinite(g)
        diff = torch.where(finite, (g - r).abs(), torch.full_like(r, float("inf")))
        bound = tol["atol"] + tol["rtol"] * r.abs() + tol["term"] * a
        if fl is not None:
            bound = bound + tol["floor"] * fl
        n_bad = int((diff > bound).sum())
        mx = float(diff.max()) if diff.numel() else 0.0
        sq = float((torch.where(finite, diff, torch.zeros_like(diff)) ** 2).sum())
        sq = float("inf") if not bool(finite.all()) else sq
        rr = float((r ** 2).sum())
        rel = math.sqrt(sq / rr) if rr > 0 else (0.0 if sq == 0 else float("inf"))
        if not rel <= tol["rel_l2"]:
            n_bad += 1  # the tensor's norm bound
        per[name] = {"max_error": mx if math.isfinite(mx) else None, "bad": n_bad,
                     "rel_l2_error": rel if math.isfinite(rel) else None}
        bad, max_err, num, den = bad + n_bad, max(max_err, mx), num + sq, den + rr
    rel_l2 = math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else float("inf"))
    where = "gpu" if ref[0].is_cuda else "cpu"
    return {"max_error": max_err if math.isfinite(max_err) else None,
            "rel_l2_error": rel_l2 if math.isfinite(rel_l2) else None,
            "verified_against": "{}_{}".format(where, "f64" if ref[0].dtype == torch.float64 else "f32"),
            "tolerance": dict(tol), "grad_errors": per, "_bad": bad}


def grads_close(torch, p: dict, a, b) -> bool:
    """Two runs' gradients agree within atol + 2 rtol * |b| (rtol is one unit in the last place of the dtype: a
    differently ordered fp32 sum may round to the neighbouring value, doubled): what a CUDA graph's replay must give
    unverified (--no-verify), where the backward accumulates dQ by atomics and is not bitwise reproducible."""
    tol = GRAD_TOLERANCE[p["dtype"]]
    return all(bool(torch.isfinite(x).all()) and bool(
        ((x.float() - y.float()).abs() <= tol["atol"] + 2 * tol["rtol"] * y.float().abs()).all())
        for x, y in zip(a, b))
