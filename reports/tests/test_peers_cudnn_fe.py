"""The cuDNN frontend's peers (peers/cudnn_fe.py) without a GPU: the graphs' shapes and arguments, the skip line
without the frontend, the per-tensor requantization of e4m3 inputs, and, where the frontend is installed, the
arguments against its bindings and the graphs built up to cuDNN's operation graph (no device needed there)."""
import math
import re

import pytest

from flashbench_reports.peers import cudnn_fe


def _p(peers, **kw):
    base = {"batch": 2, "heads_q": 8, "heads_kv": 2, "seqlen_q": 100, "seqlen_kv": 130, "head_dim": 64,
            "causal": True, "dtype": "bf16"}
    return peers.normalize_problem(dict(base, **kw))


def test_graph_spec_follows_the_problems_layout(peers):
    s = cudnn_fe.graph_spec(_p(peers))
    B, Hq, Hkv, Sq, Skv, D = 2, 8, 2, 100, 130, 64
    assert s["q"] == ((B, Hq, Sq, D), (Sq * Hq * D, D, Hq * D, 1))  # bshd storage as SDPA's [B, H, S, D]
    assert s["k"] == s["v"] == s["dK"] == s["dV"] == ((B, Hkv, Skv, D), (Skv * Hkv * D, D, Hkv * D, 1))
    assert s["o"] == s["dO"] == s["dQ"] == s["q"]
    assert s["stats"] == ((B, Hq, Sq, 1), (Hq * Sq, Sq, 1, 1))
    assert s["io"] == s["out"] == "BFLOAT16" and s["causal"]
    assert s["attn_scale"] == pytest.approx(1 / math.sqrt(D))
    b = cudnn_fe.graph_spec(_p(peers, layout="bhsd", dtype="fp16", scale=0.5, causal=False))
    assert b["q"] == ((B, Hq, Sq, D), (Hq * Sq * D, Sq * D, D, 1)) and b["io"] == "HALF"
    assert b["attn_scale"] == 0.5 and not b["causal"]
    f = cudnn_fe.graph_spec(_p(peers, dtype="e4m3"))
    # O in e4m3: cuDNN's FP8 forward writes bf16 only on Blackwell
    assert (f["io"], f["out"]) == ("FP8_E4M3", "FP8_E4M3")


def test_op_arguments_mask_bottom_right(peers):
    s = cudnn_fe.graph_spec(_p(peers))
    assert cudnn_fe.op_kwargs(s, "sdpa") == {"attn_scale": s["attn_scale"], "generate_stats": True,
                                             "diagonal_alignment": "BOTTOM_RIGHT", "diagonal_band_right_bound": 0}
    assert cudnn_fe.op_kwargs(s, "sdpa_fp8")["right_bound"] == 0
    bwd = cudnn_fe.op_kwargs(s, "sdpa_backward")
    assert bwd["use_deterministic_algorithm"] is False and "generate_stats" not in bwd
    assert bwd["diagonal_band_right_bound"] == 0
    nc = cudnn_fe.op_kwargs(cudnn_fe.graph_spec(_p(peers, causal=False)), "sdpa")
    assert "diagonal_alignment" not in nc and "diagonal_band_right_bound" not in nc


def test_fp8_masks_top_left_where_it_is_the_same_mask(peers):
    """cuDNN's FP8 forward takes only a top-left causal mask before Blackwell: the peer asks for it where
    seqlen_q == seqlen_kv (the same mask as bottom-right), and for bottom-right otherwise (skipped where refused)."""
    sq = cudnn_fe.op_kwargs(cudnn_fe.graph_spec(_p(peers, dtype="e4m3", seqlen_kv=100)), "sdpa_fp8")
    assert sq["diagonal_alignment"] == "TOP_LEFT" and sq["right_bound"] == 0
    assert cudnn_fe.op_kwargs(cudnn_fe.graph_spec(_p(peers, dtype="e4m3")), "sdpa_fp8")["diagonal_alignment"] == \
        "BOTTOM_RIGHT"
    # the 16-bit forward and backward keep bottom-right, which cuDNN runs on Hopper
    assert cudnn_fe.op_kwargs(cudnn_fe.graph_spec(_p(peers, seqlen_kv=100)), "sdpa")["diagonal_alignment"] == \
        "BOTTOM_RIGHT"


def test_o_scale_keeps_o_inside_e4m3_with_headroom(peers):
    torch = pytest.importorskip("torch")
    for amax in (0.3, 1.0, 4.5, 7.0, 448.0):
        v = torch.tensor([[0.1, -amax], [amax / 2, 0.0]])
        so = float(cudnn_fe.o_scale(torch, v))
        assert so == 2.0 ** round(math.log2(so))  # a power of two: descale_o exact
        assert cudnn_fe.O_HEADROOM * amax * so <= cudnn_fe.E4M3_MAX < 2 * cudnn_fe.O_HEADROOM * amax * so


def test_without_the_frontend_each_peer_is_skipped_with_one_line(peers, monkeypatch):
    monkeypatch.setattr(cudnn_fe, "import_cudnn", lambda: (None, "ModuleNotFoundError: No module named 'cudnn'"))
    for name, dtype in (("cudnn_fe", "bf16"), ("cudnn_fp8", "e4m3")):
        why = peers.make_peer(None, name, _p(peers, dtype=dtype)).skip_reason()
        assert "\n" not in why and "No module named 'cudnn'" in why, why
        assert "pip install nvidia-cudnn-frontend" in why and "--no-index" in why, why


def test_each_peer_keeps_to_its_dtypes_and_pass(peers, monkeypatch):
    monkeypatch.setattr(cudnn_fe, "import_cudnn", lambda: (object(), ""))
    reason = lambda name, **kw: peers.make_peer(None, name, _p(peers, **kw)).skip_reason()
    assert reason("cudnn_fe") is None and reason("cudnn_fe", dtype="fp16") is None
    assert reason("cudnn_fp8", dtype="e4m3") is None
    assert "e4m3 problems only" in reason("cudnn_fp8")
    assert "fp16 or bf16" in reason("cudnn_fe", dtype="e4m3") and "fp16 or bf16" in reason("cudnn_fe", dtype="fp32")
    assert reason("cudnn_fe", **{"pass": "bwd", "heads_kv": 8}) is None
    assert "backward" in reason("cudnn_fp8", **{"pass": "bwd", "dtype": "bf16"})
    assert "paged" in reason("cudnn_fe", seqlen_q=1, page_size=16)


def test_the_fp8_peer_gets_one_descale_per_tensor_from_the_same_values(peers):
    torch = pytest.importorskip("torch")
    p = _p(peers, dtype="e4m3", seqlen_q=300, seqlen_kv=300)
    inp = peers.make_inputs(torch, p, 9, "cpu")
    for val, like in zip(inp.values, inp):
        codes, ds = cudnn_fe.requantize_per_tensor(torch, val, like)
        assert codes.dtype == torch.float8_e4m3fn and codes.stride() == like.stride() and ds.shape == (1, 1, 1, 1)
        assert float(ds) == pytest.approx(float(val.abs().max()) / 448.0)
        back = codes.float() * ds
        # e4m3 keeps 3 mantissa bits: half an ulp is 1/16 relative, and below 2^-6 the subnormals' step, 2^-9
        assert bool(((back - val).abs() <= val.abs() / 16 + float(ds) * 2.0 ** -10).all())


def _bindings(cudnn, op):
    """The keyword names of the frontend's C++ binding of op (its docstring's signature line)."""
    sig = getattr(cudnn._pybind_module.backend_graph, op).__doc__.splitlines()[0]
    return set(re.findall(r"(\w+): ", sig))


@pytest.mark.parametrize("op,square", [("sdpa", False), ("sdpa_fp8", False), ("sdpa_fp8", True),
                                       ("sdpa_backward", False)])
def test_arguments_are_the_bindings_and_graphs_build(peers, op, square):
    pytest.importorskip("torch")  # the frontend finds cuDNN through torch's libraries where they are
    cudnn, why = cudnn_fe.import_cudnn()
    if cudnn is None:
        pytest.skip("the cuDNN frontend is not importable here: " + why)
    p = _p(peers, dtype="e4m3" if op == "sdpa_fp8" else "bf16", **({"seqlen_kv": 100} if square else {}))
    s = cudnn_fe.graph_spec(p)
    names = set(cudnn_fe.op_kwargs(s, op))
    if op == "sdpa_fp8":
        names |= set(cudnn_fe.FP8_SCALARS)
    # the frontend takes unknown keywords silently; a misspelt one would only be lost, so compare with the bindings
    assert names <= _bindings(cudnn, op), names - _bindings(cudnn, op)
    g, t = cudnn_fe.build_graph(cudnn, s, op)
    if op == "sdpa_backward":
        assert [tuple(t[n].get_dim()) for n in ("dQ", "dK", "dV")] == [s["dQ"][0], s["dK"][0], s["dV"][0]]
        assert tuple(t["dK"].get_stride()) == s["dK"][1]
    else:
        assert tuple(t["o"].get_dim()) == s["o"][0] and tuple(t["o"].get_stride()) == s["o"][1]
        assert tuple(t["stats"].get_dim()) == s["stats"][0]


class _FakeHandle:
    pass


def _fake_frontend(cudnn, executed):
    """The frontend with its device steps stood in for: no handle, no plans, and execute() records the pack."""
    class Frontend:
        def __getattr__(self, name):
            return getattr(cudnn, name)

        @staticmethod
        def backend_version():
            return cudnn.backend_version()

        @staticmethod
        def create_handle():
            return _FakeHandle()

        @staticmethod
        def set_stream(handle, stream):
            pass

        @staticmethod
        def destroy_handle(handle):
            pass
    real_execute = cudnn.pygraph.execute

    def execute(self, pack, ws, handle=None):
        executed.append((self, pack))
    return Frontend(), real_execute, execute


_TORCH_TYPE = {"BFLOAT16": "bfloat16", "HALF": "float16", "FLOAT": "float32", "FP8_E4M3": "float8_e4m3fn"}


@pytest.mark.parametrize("dtype,pass_", [("bf16", "fwd"), ("fp16", "bwd"), ("e4m3", "fwd")])
def test_every_graph_tensor_is_bound_to_a_buffer_of_its_shape(peers, monkeypatch, dtype, pass_):
    torch = pytest.importorskip("torch")
    cudnn, why = cudnn_fe.import_cudnn()
    if cudnn is None:
        pytest.skip("the cuDNN frontend is not importable here: " + why)
    executed = []
    frontend, _, execute = _fake_frontend(cudnn, executed)
    monkeypatch.setattr(cudnn.pygraph, "execute", execute)
    monkeypatch.setattr(cudnn.pygraph, "get_workspace_size", lambda self, *a, **k: 256)
    monkeypatch.setattr(cudnn_fe.CudnnFe, "_plan", lambda self, g: "(no plans on the CPU)")
    name = "cudnn_fp8" if dtype == "e4m3" else "cudnn_fe"
    p = _p(peers, dtype=dtype, seqlen_q=40, seqlen_kv=72, **{"pass": pass_})
    inp = peers.make_inputs(torch, p, 3, "cpu")
    pe = peers.make_peer(torch, name, p)
    pe.cudnn, pe.inputs = frontend, inp
    out = pe.build(*inp)()
    assert len(executed) == (2 if pass_ == "bwd" else 1)  # the backward's own forward, untimed, then the timed call
    for g, pack in executed:
        bound = {t.uid: x for t, x in pack.items()}
        graph = {t.uid: t for t in g._tensors.values() if not t.is_virtual}
        assert set(bound) == set(graph)
        for uid, t in graph.items():
            x = bound[uid]
            assert list(x.shape) == list(t.dim) and list(x.stride()) == list(t.stride), t
            assert str(x.dtype) == "torch." + _TORCH_TYPE[t.data_type.name], t
    g, pack = executed[-1]
    if pass_ == "bwd":
        assert [tuple(x.shape) for x in out] == [tuple(x.shape) for x in inp]
        assert pe.extra["peer_deterministic"] is False
    else:
        assert out.dtype == (torch.float8_e4m3fn if dtype == "e4m3" else inp[0].dtype)
    if dtype == "e4m3":
        assert pe.extra["peer_descale"] == "per_tensor" and pe.extra["peer_p_scale"] == cudnn_fe.FP8_P_SCALE
        scal = {t.name: x for t, x in pack.items() if t.name in cudnn_fe.FP8_SCALARS}
        assert float(scal["scale_s"]) * float(scal["descale_s"]) == 1.0
        assert float(scal["scale_o"]) * float(pe.o_descale) == 1.0 and pe.extra["peer_o_dtype"] == "e4m3"
        assert float(scal["scale_o"]) == float(cudnn_fe.o_scale(torch, pe.ref_values[2]))
        assert all(float(scal[n]) > 0 for n in ("descale_q", "descale_k", "descale_v"))
        # the check compares with the values it was given: its codes times its one descale
        codes = [x for t, x in pack.items() if t.name in ("q", "k", "v")]
        assert len(codes) == 3 and all(torch.equal(c.float() * d, r) for c, d, r in zip(
            codes, (scal["descale_q"], scal["descale_k"], scal["descale_v"]), pe.ref_values))
    pe.poison()
    assert all(bool(torch.isnan(x.float()).all()) for x in (out if pass_ == "bwd" else (out,)))
    pe.close()


def _e4m3_problem(peers):
    return _p(peers, dtype="e4m3", batch=1, heads_q=2, heads_kv=1, seqlen_q=48, seqlen_kv=48, head_dim=16)


def _e4m3_o(torch, peers, p, inp):
    """The exact O of the inputs' values, written as cudnn_fp8 writes it: e4m3 codes of O * scale_o."""
    from flashbench_reports.peers.backward import reference_forward
    ref, _ = reference_forward(torch, p, *(x.double() for x in inp.values))
    so = cudnn_fe.o_scale(torch, inp.values[2])
    return (ref.float() * so).to(torch.float8_e4m3fn), 1.0 / so


def test_an_e4m3_o_is_checked_with_its_own_rounding(peers):
    """O rounded to e4m3 (codes * descale_o) passes with the added bound max(2^-4 |O|, 2^-10 descale_o) per
    element and its norm added to rel_l2; an O off by more than the bound still fails."""
    torch = pytest.importorskip("torch")
    p = _e4m3_problem(peers)
    inp = peers.make_inputs(torch, p, 5, "cpu")
    codes, ods = _e4m3_o(torch, peers, p, inp)
    got = codes.float() * ods
    ok = peers.reference_check(torch, p, *inp.values, got, o_descale=ods)
    assert ok["_bad"] == 0 and ok["max_error"] > 0
    tol = ok["tolerance"]
    assert tol["o_e4m3_round"] == 2.0 ** -4 and tol["o_e4m3_subnormal"] == 2.0 ** -10 * float(ods)
    assert tol["rel_l2"] > peers.E4M3_REL_L2
    off = got.clone()
    off[0, 1, 7, 3] += 0.5
    assert peers.reference_check(torch, p, *inp.values, off, o_descale=ods)["_bad"] == 1
    # without o_descale the bound and the record are the e4m3 forward's, unchanged
    assert "o_e4m3_round" not in peers.reference_check(torch, p, *inp.values, got)["tolerance"]


class _Fp8OPeer:
    """A peer that writes O in e4m3 with a descale (as cudnn_fp8): the runner checks codes * o_descale."""
    config, poison, extra = "", None, {}

    def __init__(self, name, p):
        self.name, self.p = name, p

    def skip_reason(self):
        return None

    def build(self, q, k, v):
        torch = pytest.importorskip("torch")
        codes, self.o_descale = _e4m3_o(torch, None, self.p, self.inputs)
        return lambda: codes

    def close(self):
        pass


def test_runner_reads_an_e4m3_o_through_its_descale(peers, monkeypatch):
    torch = pytest.importorskip("torch")
    from test_peers_bwd import _CallTimer, _CpuTorch
    p = _e4m3_problem(peers)
    monkeypatch.setattr(peers.runner, "make_inputs", lambda t, p, seed, device: peers.make_inputs(t, p, seed, "cpu"))
    rec = peers.run_problem(_CpuTorch(torch), _CallTimer(), [_Fp8OPeer("fp8o", p)], p, 5, True, 1)[0]
    assert rec["status"] == "ok", rec["reason"]
    assert rec["tolerance"]["o_e4m3_round"] == 2.0 ** -4
