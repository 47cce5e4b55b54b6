"""peers.py on backward problems (pass: bwd), without a GPU: which peers run them, the inputs' shapes, the reference
gradients (against finite differences and against torch's own math attention, in float64 on the CPU), the check of
a peer's gradients, and a backward problem through the runner (verified, or incorrect) with torch on the CPU.
The tests that need torch are skipped where it is absent."""
import json
import math
import subprocess
import sys

import pytest

from conftest import PEERS

BWD = {"batch": 1, "heads_q": 2, "heads_kv": 1, "seqlen_q": 5, "seqlen_kv": 3, "head_dim": 4, "causal": True,
       "dtype": "fp32", "layout": "bshd", "pass": "bwd"}


def _p(peers, **kw):
    return peers.normalize_problem(dict(BWD, **kw))


def test_backward_peers_and_the_others_reasons(peers):
    p = _p(peers, dtype="bf16")
    runs = [n for n in peers.PEERS if n not in ("cudnn_fe",) and not peers.make_peer(None, n, p).skip_reason()]
    assert runs == ["torch_flash", "torch_cudnn", "torch_efficient"]
    for n in ("flex", "torch_fp8", "cudnn_fp8"):
        why = peers.make_peer(None, n, p).skip_reason()
        assert "backward" in why and "\n" not in why, why
    # cudnn_fe runs it where the frontend is importable, else says how to install it
    why = peers.make_peer(None, "cudnn_fe", p).skip_reason()
    assert why is None or "pip install" in why
    # fp32: torch's flash and cuDNN backends take fp16/bf16 only, backward or not
    assert "fp16 or bf16" in peers.make_peer(None, "torch_flash", _p(peers)).skip_reason()


def test_backward_records_name_the_pass(peers):
    p = _p(peers, dtype="bf16", seqlen_q=512, seqlen_kv=512, heads_q=16, heads_kv=16, head_dim=128)
    timing = dict(peers.summarize([100.0, 100.0]), samples_us=[100.0, 100.0])
    r = peers.record("torch_flash", p, "ok", timing=timing)
    assert r["name"].endswith("_bwd") and r["problem"]["pass"] == "bwd"
    fwd = dict(p, **{"pass": "fwd"})
    assert r["flops"] == pytest.approx(2.5 * peers.flops(fwd))  # five GEMMs against the forward's two


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_inputs_carry_dout_shaped_like_q(peers, layout):
    torch = pytest.importorskip("torch")
    p = dict(_p(peers, dtype="bf16"), layout=layout)  # bhsd: not a harness backward, but the inputs still follow it
    inp = peers.make_inputs(torch, p, 7, "cpu")
    q, k, v = inp
    assert tuple(q.shape) == (1, 2, 5, 4) and tuple(k.shape) == tuple(v.shape) == (1, 1, 3, 4)
    assert inp.dout.shape == q.shape and inp.dout.stride() == q.stride() and inp.dout.dtype == torch.bfloat16
    assert q.transpose(1, 2).is_contiguous() == (layout == "bshd")
    assert not torch.equal(inp.dout.float(), q.float())  # drawn after Q, K and V, not a copy
    fwd = peers.make_inputs(torch, dict(p, **{"pass": "fwd"}), 7, "cpu")
    assert type(fwd) is tuple and all(torch.equal(a, b) for a, b in zip(fwd, inp))  # same Q, K, V as the forward


def _loss(torch, peers, p, q, k, v, dout):
    o, _ = peers.reference_forward(torch, p, q, k, v, dtype=torch.float64)
    return float((o.double() * dout).sum())


@pytest.mark.parametrize("shape", [dict(seqlen_q=5, seqlen_kv=3), dict(seqlen_q=3, seqlen_kv=6),
                                   dict(seqlen_q=4, seqlen_kv=4, causal=False)])
def test_reference_gradients_match_finite_differences(peers, shape):
    torch = pytest.importorskip("torch")
    p = _p(peers, **shape)
    g = torch.Generator().manual_seed(3)
    B, Hq, Hkv, Sq, Skv, D = (p[x] for x in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim"))
    q = torch.randn(B, Hq, Sq, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, Skv, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, Skv, D, generator=g, dtype=torch.float64)
    dout = torch.randn(B, Hq, Sq, D, generator=g, dtype=torch.float64)
    p64 = dict(p, dtype="fp32")
    grads = peers.reference_grads(torch, p64, q, k, v, dout, dtype=torch.float64)  # O, LSE exact in float64
    eps = 1e-6
    for x, gx in zip((q, k, v), grads):
        assert gx.shape == x.shape and bool(torch.isfinite(gx).all())
        num = torch.zeros_like(x)
        flat, nflat = x.view(-1), num.view(-1)
        for i in range(flat.numel()):
            keep = float(flat[i])
            flat[i] = keep + eps
            up = _loss(torch, peers, p64, q, k, v, dout)
            flat[i] = keep - eps
            down = _loss(torch, peers, p64, q, k, v, dout)
            flat[i] = keep
            nflat[i] = (up - down) / (2 * eps)
        assert float((gx - num).abs().max()) < 1e-6, (gx - num).abs().max()
    if p["causal"] and Sq > Skv:  # the first Sq - Skv rows see no key: no gradient, no NaN
        assert float(grads[0][:, :, :Sq - Skv].abs().max()) == 0.0


def test_reference_matches_torch_math_attention_under_gqa(peers):
    torch = pytest.importorskip("torch")
    p = _p(peers, heads_q=4, heads_kv=2, seqlen_q=6, seqlen_kv=9, head_dim=8, batch=2)
    inp = peers.make_inputs(torch, p, 11, "cpu")
    q, k, v = (x.double().detach().requires_grad_() for x in inp)
    grp = 2
    s = (q @ k.repeat_interleave(grp, 1).transpose(-1, -2)) / math.sqrt(8)
    i, j = torch.arange(6)[:, None], torch.arange(9)[None, :]
    o = torch.softmax(s.masked_fill(j > i + 3, float("-inf")), -1) @ v.repeat_interleave(grp, 1)
    want = torch.autograd.grad(o, (q, k, v), inp.dout.double())
    # on float64 inputs O and LSE are exact: the formulas equal autograd to rounding
    exact = peers.reference_grads(torch, p, *(x.double() for x in inp), inp.dout.double())
    assert all(float((a - b).abs().max()) < 1e-12 for a, b in zip(exact, want))
    # the problem's own: O rounded to its dtype (fp32) and LSE in fp32, as a catalog variant reads them
    got = inp.reference()
    assert all(float((a - b).abs().max()) < 1e-5 for a, b in zip(got, want))
    O, lse = inp.forward()
    assert float((O.double() - o.detach()).abs().max()) < 1e-6 and O.dtype == torch.float32
    want_lse = torch.logsumexp(s.detach().masked_fill(j > i + 3, float("-inf")), -1)
    assert float((lse.double() - want_lse).abs().max()) < 1e-5


def test_reference_sums_bound_each_terms_size(peers):
    torch = pytest.importorskip("torch")
    p = _p(peers, dtype="fp16", heads_q=4, heads_kv=2, seqlen_q=6, seqlen_kv=9, head_dim=8)
    inp = peers.make_inputs(torch, p, 13, "cpu")
    ref = inp.reference()
    # abs bounds the value (a sum of terms is at most the sum of their sizes); floor is fp16's alone
    assert all(bool((a >= r.abs() - 1e-12).all()) for a, r in zip(ref.abs, ref))
    assert ref.floor is not None and all(bool((f >= 0).all()) for f in ref.floor)
    # the rows that see no key (causal, seqlen_q > seqlen_kv would have them; here the first row sees 4 keys):
    # dV's floor is the sum of |dO| over the queries that see each key, under the mask
    q, k, v = inp
    grp, off = 2, 3
    i, j = torch.arange(6)[:, None], torch.arange(9)[None, :]
    seen = (j <= i + off).double()
    want = sum(seen.T @ inp.dout[0, h].double().abs() for h in range(grp))
    assert float((ref.floor[2][0, 0] - want).abs().max()) < 1e-9
    assert peers.reference_grads(torch, dict(p, dtype="bf16"), *inp, inp.dout).floor is None


def test_grad_check_counts_each_bad_element(peers):
    torch = pytest.importorskip("torch")
    p = _p(peers, dtype="bf16", heads_q=4, heads_kv=2, seqlen_q=6, seqlen_kv=9, head_dim=8)
    inp = peers.make_inputs(torch, p, 5, "cpu")
    ref = inp.reference()
    good = tuple(x.to(torch.bfloat16) for x in ref)
    c = peers.grad_check(torch, p, ref, good)
    assert c["_bad"] == 0 and c["verified_against"] == "cpu_f64" and set(c["grad_errors"]) == {"dq", "dk", "dv"}
    tol = peers.GRAD_TOLERANCE["bf16"]
    assert c["tolerance"] == tol and tol["rtol"] == 2 * 2.0 ** -9  # the harness's (verify.cpp)
    wrong = [x.clone() for x in good]
    bound = tol["atol"] + tol["rtol"] * float(ref[1][0, 1, 2, 3].abs()) + tol["term"] * float(ref.abs[1][0, 1, 2, 3])
    wrong[1][0, 1, 2, 3] += 2 * bound
    wrong[2][0, 0, 0, 0] = float("nan")
    c = peers.grad_check(torch, p, ref, wrong)
    assert c["grad_errors"]["dk"]["bad"] == 1 and c["grad_errors"]["dq"]["bad"] == 0
    assert c["grad_errors"]["dv"]["bad"] == 2 and c["_bad"] == 3  # the NaN, and so dv's norm bound
    assert c["rel_l2_error"] is None  # a NaN makes the norm infinite
    # a gradient a few percent off everywhere passes element bounds nowhere near, and fails the norm bound too
    scaled = (good[0], good[1], (ref[2] * 1.05).to(torch.bfloat16))
    assert peers.grad_check(torch, p, ref, scaled)["grad_errors"]["dv"]["bad"] >= 1
    with pytest.raises(ValueError, match="dk has shape"):
        peers.grad_check(torch, p, ref, (good[0], good[0], good[2]))
    assert peers.grads_close(torch, p, good, good) and not peers.grads_close(torch, p, wrong, good)


class _CpuCuda:
    OutOfMemoryError = MemoryError

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def Stream():
        raise RuntimeError("no CUDA graphs on the CPU")  # as_graph falls back to the eager call


class _CpuTorch:
    """torch with a CPU stand-in for the few torch.cuda calls of the runner."""
    cuda = _CpuCuda

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        return getattr(self._torch, name)


class _GradPeer:
    config, poison = "", None

    def __init__(self, name, p, scale_dk=1.0):
        self.name, self.p, self.extra, self.scale_dk = name, p, {}, scale_dk

    def skip_reason(self):
        return None

    def build(self, q, k, v):
        ref = self.inputs.reference()
        grads = (ref[0].to(q.dtype), (ref[1] * self.scale_dk).to(q.dtype), ref[2].to(q.dtype))
        return lambda: grads

    def close(self):
        pass


class _CallTimer:
    def measure(self, fn):
        fn()
        return {"median_us": 10.0, "min_us": 10.0, "max_us": 10.0, "mean_us": 10.0, "cv": 0.0,
                "samples_us": [10.0, 10.0]}


def test_runner_verifies_backward_gradients(peers, monkeypatch):
    torch = pytest.importorskip("torch")
    p = _p(peers, dtype="bf16", heads_q=4, heads_kv=2, seqlen_q=6, seqlen_kv=9, head_dim=8)
    monkeypatch.setattr(peers.runner, "make_inputs", lambda t, p, seed, device: peers.make_inputs(t, p, seed, "cpu"))
    recs = peers.run_problem(_CpuTorch(torch), _CallTimer(), [_GradPeer("good", p), _GradPeer("bad", p, 1.5)], p,
                             7, True, 1)
    by = {r["variant"]: r for r in recs}
    assert by["peer:bad"]["status"] == "incorrect" and "beyond" in by["peer:bad"]["reason"]
    assert by["peer:good"]["status"] == "ok" and by["peer:good"]["verified_against"] == "cpu_f64"
    assert by["peer:good"]["name"].endswith("_bwd") and by["peer:good"]["launch"].startswith("eager")
    assert by["peer:good"]["grad_errors"]["dq"]["bad"] == 0


def test_peers_option_lists_the_frontend_peers(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"problems": [dict(BWD, dtype="bf16")]}))
    r = subprocess.run([sys.executable, PEERS, "--problems", str(plan), "-o", str(tmp_path / "o.json"),
                        "--peers", "cudnn_fx"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cudnn_fe,cudnn_fp8" in r.stderr, r.stderr


class _MathPeer:
    """Peer.build_bwd over torch's math attention on the CPU (the GPU backends' stand-in): the autograd path, the
    layout of dO and the repeated backward of one forward."""

    def __new__(cls, peers, torch, p):
        class MathPeer(peers.Peer):
            def build_fwd(self, q, k, v):
                F = torch.nn.functional
                i = torch.arange(p["seqlen_q"])[:, None]
                j = torch.arange(p["seqlen_kv"])[None, :]
                mask = (j <= i + p["seqlen_kv"] - p["seqlen_q"]) if p["causal"] else None
                return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return MathPeer(torch, "torch_flash", p)


def test_autograd_backward_is_timed_apart_from_its_forward(peers):
    torch = pytest.importorskip("torch")
    p = _p(peers, heads_q=4, heads_kv=2, seqlen_q=8, seqlen_kv=8, head_dim=8)
    inp = peers.make_inputs(torch, p, 17, "cpu")
    pe = _MathPeer(peers, torch, p)
    pe.inputs = inp
    fn = pe.build(*inp)
    out, dout, leaves, _ = pe.saved
    assert dout.stride() == out.stride() and torch.equal(dout, inp.dout.to(out.dtype))
    first, second = fn(), fn()  # retain_graph: every call runs the same backward
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert [tuple(g.shape) for g in first] == [tuple(x.shape) for x in inp]  # GQA: dK, dV of the kv heads
    c = peers.grad_check(torch, p, inp.reference(), first)
    assert c["_bad"] == 0, c
    assert pe.extra["peer_backward"].startswith("torch.autograd.grad")
    pe.close()
    assert pe.saved is None


class _FakeCapi:
    """libflashbench_capi.so's functions as peers' Ours calls them, recording the backward's arguments."""
    path, has_choice, has_backward = "/fake/libflashbench_capi.so", True, True

    def __init__(self):
        self.calls = []
        lib = self

        class Lib:
            @staticmethod
            def fb_capi_create(variant, config, problem):
                lib.calls.append(("create", variant, config, json.loads(problem)))
                return 1

            fb_capi_config_string = staticmethod(lambda h: b"block_m=64,deterministic=off")
            fb_capi_variant = staticmethod(lambda h: b"fa2_bwd")
            fb_capi_choice = staticmethod(lambda h: b"given")

            @staticmethod
            def fb_capi_launch_backward(*args):
                lib.calls.append(("launch_backward",) + args)
                return 0

            @staticmethod
            def fb_capi_destroy(h):
                lib.calls.append(("destroy", h))
        self.lib = Lib

    def error(self):
        return ""


def test_ours_passes_the_backwards_buffers_in_the_c_apis_order(peers):
    torch = pytest.importorskip("torch")
    p = _p(peers, dtype="bf16", heads_q=4, heads_kv=2, seqlen_q=6, seqlen_kv=9, head_dim=8)
    inp = peers.make_inputs(torch, p, 21, "cpu")
    lib = _FakeCapi()
    ours = peers.Ours(torch, lib, "fa2_bwd", "default", p)
    ours.inputs = inp
    grads = ours.build(*inp)()
    create = lib.calls[0]
    assert create[:3] == ("create", b"fa2_bwd", b"default") and create[3]["pass"] == "bwd"
    o, lse = inp.forward()
    launch = lib.calls[1]
    want = [x.data_ptr() for x in (*inp, o, lse, inp.dout, *grads)]
    assert launch[0] == "launch_backward" and launch[1] == 1 and list(launch[2:11]) == want
    assert all(g.stride() == x.stride() for g, x in zip(grads, inp))  # bshd, like Q, K, V
    assert all(bool(torch.isnan(g.float()).all()) for g in grads)  # poisoned: the stand-in wrote nothing
    assert ours.config == "block_m=64,deterministic=off" and ours.extra["chosen_variant"] == "fa2_bwd"
    ours.close()
    assert lib.calls[-1] == ("destroy", 1)


def _own_forward_o(torch, p, q, k, v):
    """O of a flash-style forward: P = exp(S - max) rounded to the dtype before P V (fp32 accumulation), then
    divided by the row sum and rounded: it differs from the reference's rounded O by an ulp in many elements."""
    scale = p["scale"] or 1.0 / math.sqrt(p["head_dim"])
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if p["causal"]:
        i = torch.arange(p["seqlen_q"])[:, None]
        j = torch.arange(p["seqlen_kv"])[None, :]
        s = s.masked_fill(j > i + p["seqlen_kv"] - p["seqlen_q"], float("-inf"))
    e = torch.exp(s - s.amax(dim=-1, keepdim=True))
    return ((e.to(q.dtype).float() @ v.float()) / e.sum(dim=-1, keepdim=True)).to(q.dtype)


def test_backward_is_checked_against_the_o_it_read(peers):
    """A causal backward that computes D = rowsum(dO * O) exactly from its own forward's O fails the bound against
    the reference forward's O (dQ, in the first rows, which see few keys) and passes against its own: the check
    must use the O the backward read (the failure of torch_flash, torch_cudnn and cudnn_fe on causal problems)."""
    torch = pytest.importorskip("torch")
    p = _p(peers, dtype="bf16", heads_q=2, heads_kv=2, seqlen_q=128, seqlen_kv=128, head_dim=32)
    inp = peers.make_inputs(torch, p, 2, "cpu")
    o_own = _own_forward_o(torch, p, *inp)
    assert not torch.equal(o_own, inp.forward()[0])
    got = tuple(x.to(torch.bfloat16) for x in inp.reference(o_own))
    wrong = peers.grad_check(torch, p, inp.reference(), got)
    assert wrong["_bad"] > 0 and wrong["grad_errors"]["dq"]["bad"] == wrong["_bad"]
    assert peers.grad_check(torch, p, inp.reference(o_own), got)["_bad"] == 0
    # the reference forward's own O (a catalog variant's input) gives the shared reference
    assert inp.reference(inp.forward()[0].clone()) is inp.reference()


class _OwnOPeer(_GradPeer):
    """A backward exact on the O of its own (flash-style) forward, which it exposes as bwd_o, as the autograd peers
    and cudnn_fe do."""

    def build(self, q, k, v):
        torch = pytest.importorskip("torch")
        self.bwd_o = _own_forward_o(torch, self.p, q, k, v)
        grads = tuple(x.to(q.dtype) for x in self.inputs.reference(self.bwd_o))
        return lambda: grads


def test_runner_checks_a_backward_against_its_own_o(peers, monkeypatch):
    torch = pytest.importorskip("torch")
    p = _p(peers, dtype="bf16", heads_q=2, heads_kv=2, seqlen_q=128, seqlen_kv=128, head_dim=32)
    monkeypatch.setattr(peers.runner, "make_inputs", lambda t, p, seed, device: peers.make_inputs(t, p, seed, "cpu"))
    recs = peers.run_problem(_CpuTorch(torch), _CallTimer(), [_OwnOPeer("own", p)], p, 2, True, 1)
    assert recs[0]["status"] == "ok", recs[0]["reason"]
