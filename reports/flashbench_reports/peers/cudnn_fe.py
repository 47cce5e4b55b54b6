"""The cuDNN frontend's peers: cuDNN's SDPA through the frontend's graph API (the nvidia-cudnn-frontend wheel,
Python module `cudnn`), beside torch's own cuDNN backend (torch_cudnn), which reaches fewer of cuDNN's options.

  cudnn_fe   fp16/bf16: the forward (graph op sdpa, writing O and the softmax statistics, as our kernels write LSE);
             on a backward problem the backward (sdpa_backward) on O and statistics of its own untimed forward.
  cudnn_fp8  e4m3: the FP8 forward (sdpa_fp8), O in e4m3 (scale_o, amax_o), which cuDNN writes on Hopper (a bf16
             O it writes on Blackwell only): one byte per element of O where ours write two, which favours the peer.

Conventions are ours: causal masks bottom-right aligned (diagonal_alignment BOTTOM_RIGHT, right bound 0), scale
1/sqrt(head_dim) unless the problem gives one, GQA by K/V of fewer heads. cudnn_fp8 masks top-left (TOP_LEFT, the
frontend's default) where seqlen_q == seqlen_kv, the same mask: cuDNN refuses a bottom-right FP8 forward before
Blackwell, and with seqlen_q != seqlen_kv there the peer is skipped with cuDNN's reason.

cuDNN's FP8 SDPA takes one descale per tensor where our e4m3 problems have one per 128-token block (Q, K) and per
(batch, kv head) (V): cudnn_fp8 is given
Q, K and V quantized per tensor from the same values (the per-block codes times their descales), and is verified
against the reference of the values it was given, with our e4m3 tolerance; its records say so (peer_descale).
P is scaled by FP8_P_SCALE before its e4m3 rounding (scale_s; descale_s its inverse) and O by o_scale (scale_o,
from V's amax; descale_o its inverse): the check compares O's codes times descale_o with the reference, with the
e4m3 tolerance plus O's own rounding to e4m3 (reference_check's o_descale).

The frontend is optional: without it (or without the cuDNN it loads) each of these peers is skipped with one line
that says how to install it. The graph's shapes and arguments (graph_spec, op_kwargs) are plain Python, tested
without a GPU (reports/tests/test_peers_cudnn_fe.py).
"""
from __future__ import annotations

import math

from .backends import Peer, first_line
from .backward import is_bwd

INSTALL_HINT = ("install the cuDNN frontend wheel: `python3 -m pip install nvidia-cudnn-frontend`, or on a machine "
                "without network `python3 -m pip install --no-index --no-deps --target DIR "
                ".whl/nvidia_cudnn_frontend-*.whl` and PYTHONPATH=DIR (docs/measurement.md, peers)")
# P = exp(S - max) in [0, 1] is multiplied by this before its e4m3 rounding: the scale cuDNN's own FP8 SDPA tests
# give for amax(P) = 1 (the largest e4m3 power of two, 128, over 4), which leaves headroom for a kernel that defers
# the rescale of its running maximum and so sees P above 1; a power of two, so its inverse (descale_s) is exact.
FP8_P_SCALE = 32.0
E4M3_MAX = 448.0
# O's scale leaves this factor of headroom under E4M3_MAX beyond V's amax (o_scale).
O_HEADROOM = 2.0
IO_TYPE = {"bf16": "BFLOAT16", "fp16": "HALF", "e4m3": "FP8_E4M3"}
FP8_SCALARS = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")


def import_cudnn():
    """(the frontend's module, "") or (None, why not)."""
    try:
        import cudnn
    except Exception as e:  # ImportError, or OSError from a cuDNN library it cannot load
        return None, first_line(e)
    if not hasattr(cudnn, "pygraph"):
        return None, "the module `cudnn` found ({}) is not the cuDNN frontend".format(
            getattr(cudnn, "__file__", "?"))
    return cudnn, ""


def _dims_strides(p: dict, heads: int, seq: int, width: int):
    """[B, H, S, width] in the problem's layout: bshd storage (B, S, H, width) or bhsd (B, H, S, width)."""
    B = p["batch"]
    if p["layout"] == "bshd":
        return (B, heads, seq, width), (seq * heads * width, width, heads * width, 1)
    return (B, heads, seq, width), (heads * seq * width, seq * width, width, 1)


def graph_spec(p: dict) -> dict:
    """What the peer's graphs are built from: each tensor's dims and strides ([B, H, S, D] as SDPA's, strides of
    the problem's layout; stats [B, Hq, Sq, 1] fp32), the I/O and output data types (cudnn.data_type names), the
    softmax scale and the causal mask."""
    B, Hq, Hkv, Sq, Skv, D = (p[x] for x in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim"))
    io = IO_TYPE[p["dtype"]]
    q = _dims_strides(p, Hq, Sq, D)
    kv = _dims_strides(p, Hkv, Skv, D)
    fp8 = p["dtype"] == "e4m3"
    # e4m3: O in e4m3 as well (cuDNN's FP8 forward writes bf16 only on Blackwell); TOP_LEFT where it is the same
    # mask as BOTTOM_RIGHT (cuDNN's FP8 forward takes only TOP_LEFT before Blackwell)
    align = "TOP_LEFT" if fp8 and Sq == Skv else "BOTTOM_RIGHT"
    return {"io": io, "out": io, "align": align,
            "q": q, "k": kv, "v": kv, "o": q, "dO": q, "dQ": q, "dK": kv, "dV": kv,
            "stats": ((B, Hq, Sq, 1), (Hq * Sq, Sq, 1, 1)),
            "attn_scale": p["scale"] or 1.0 / math.sqrt(D), "causal": bool(p["causal"])}


def op_kwargs(spec: dict, op: str) -> dict:
    """The graph op's keyword arguments other than its tensors, by the bindings' names (sdpa and sdpa_backward
    name the causal bound diagonal_band_right_bound, sdpa_fp8 right_bound). The alignment is given by name
    (cudnn.diagonal_alignment's member), resolved in build_graph."""
    kw = {"attn_scale": spec["attn_scale"]}
    if op in ("sdpa", "sdpa_fp8"):
        kw["generate_stats"] = True
    if op == "sdpa_backward":
        kw["use_deterministic_algorithm"] = False
    if spec["causal"]:
        kw["diagonal_alignment"] = spec["align"]
        kw["right_bound" if op == "sdpa_fp8" else "diagonal_band_right_bound"] = 0
    return kw


def build_graph(cudnn, spec: dict, op: str):
    """The frontend graph of `op` (sdpa, sdpa_fp8 or sdpa_backward) on spec, validated and lowered to cuDNN's
    operation graph (no device needed up to here): (graph, {name: graph tensor})."""
    dt = cudnn.data_type
    io, out = getattr(dt, spec["io"]), getattr(dt, spec["out"])
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT)
    t = {}

    def tensor(name, data_type):
        dims, strides = spec[name]
        t[name] = g.tensor(name=name, dim=dims, stride=strides, data_type=data_type)
        return t[name]

    kw = op_kwargs(spec, op)
    if "diagonal_alignment" in kw:
        kw["diagonal_alignment"] = getattr(cudnn.diagonal_alignment, kw["diagonal_alignment"])
    q, k, v = tensor("q", io), tensor("k", io), tensor("v", io)
    if op == "sdpa_backward":
        o, dout, stats = tensor("o", io), tensor("dO", io), tensor("stats", dt.FLOAT)
        grads = g.sdpa_backward(q=q, k=k, v=v, o=o, dO=dout, stats=stats, **kw)
        for name, x in zip(("dQ", "dK", "dV"), grads):
            x.set_output(True).set_dim(spec[name][0]).set_stride(spec[name][1]).set_data_type(io)
            t[name] = x
    else:
        if op == "sdpa_fp8":
            for name in FP8_SCALARS:
                t[name] = g.tensor(name=name, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=dt.FLOAT)
            o, stats, amax_s, amax_o = g.sdpa_fp8(q=q, k=k, v=v, **{n: t[n] for n in FP8_SCALARS}, **kw)
            for name, x in (("amax_s", amax_s), ("amax_o", amax_o)):
                x.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(dt.FLOAT)
                t[name] = x
        else:
            o, stats = g.sdpa(q=q, k=k, v=v, **kw)
        o.set_output(True).set_dim(spec["o"][0]).set_stride(spec["o"][1]).set_data_type(out)
        stats.set_output(True).set_dim(spec["stats"][0]).set_stride(spec["stats"][1]).set_data_type(dt.FLOAT)
        t["o"], t["stats"] = o, stats
    g.validate()
    g.build_operation_graph()
    return g, t


def requantize_per_tensor(torch, values, like):
    """The float32 values of an e4m3 input quantized again with one descale for the whole tensor (amax / 448), as
    cuDNN's FP8 SDPA takes them: (codes laid out like `like`, descale [1, 1, 1, 1] fp32)."""
    amax = values.abs().amax().float()
    ds = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    codes = torch.empty_like(like)
    codes.copy_((values / ds).clamp(-E4M3_MAX, E4M3_MAX).to(like.dtype))
    return codes, ds.reshape(1, 1, 1, 1).contiguous()


def o_scale(torch, v_values):
    """scale_o of cuDNN's FP8 forward for the values V it computes on ([1, 1, 1, 1] fp32): the largest power of two
    with O_HEADROOM * amax(|V|) * scale_o <= E4M3_MAX. Each row of O is a softmax average of V's rows (weights
    >= 0 summing to 1), so |O| <= amax(|V|); P's e4m3 rounding (up to 2^-4 relative per weight) can lift the weights'
    sum above 1 by at most 2^-4, well inside the headroom, so no code of O saturates, while O's typical magnitude
    (that of a long average, amax / sqrt(keys)) stays among e4m3's normal numbers. A power of two, so that
    descale_o = 1 / scale_o is exact and the scaling itself rounds nothing."""
    amax = v_values.abs().amax().float().clamp_min(torch.finfo(torch.float32).tiny)
    return torch.exp2(torch.floor(torch.log2(E4M3_MAX / (O_HEADROOM * amax)))).reshape(1, 1, 1, 1).contiguous()


class CudnnFe(Peer):
    """cudnn_fe or cudnn_fp8 bound to a problem (see the module's docstring)."""
    handle = None

    def skip_reason(self):
        p, name = self.p, self.name
        if p.get("kv_lens") or p.get("page_size"):
            return "per-entry KV lengths and paged caches are not modelled by peers.py's cuDNN frontend graphs"
        if name == "cudnn_fp8" and is_bwd(p):
            return "cudnn_fp8: its backward is not timed by peers.py (the backward's problems are fp16, bf16, fp32)"
        if name == "cudnn_fp8" and p["dtype"] != "e4m3":
            return "cudnn_fp8 takes e4m3 problems only (cudnn_fe: fp16 and bf16)"
        if name == "cudnn_fe" and p["dtype"] not in ("fp16", "bf16"):
            return "cudnn_fe takes fp16 or bf16 problems (cudnn_fp8: e4m3)"
        self.cudnn, why = import_cudnn()
        if self.cudnn is None:
            return "{}: the cuDNN frontend is not importable here ({}); {}".format(name, why, INSTALL_HINT)
        return None

    def _plan(self, g):
        cudnn = self.cudnn
        try:
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
        except cudnn.cudnnGraphNotSupportedError as e:
            raise ValueError("cuDNN {} has no plan for this graph: {}".format(self.extra.get("peer_cudnn"),
                                                                             first_line(e)))
        eng = getattr(g, "selected_engine", None)
        return eng.name if eng is not None else "cudnn backend"

    def _as(self, x, spec_entry):
        """x with exactly the graph's strides (a copy if it has others)."""
        dims, strides = spec_entry
        if tuple(x.shape) == tuple(dims) and tuple(x.stride()) == tuple(strides):
            return x
        return self.torch.empty_strided(dims, strides, dtype=x.dtype, device=x.device).copy_(x)

    def _empty(self, spec_entry, dtype, device):
        return self.torch.empty_strided(spec_entry[0], spec_entry[1], dtype=dtype, device=device)

    def _runner(self, g, pack, outputs):
        """fn() executing g on torch's current stream (the handle follows it: a CUDA graph capture runs on its
        own stream) over pack, returning outputs; outputs are poisoned before a replay is compared."""
        torch, cudnn, handle = self.torch, self.cudnn, self.handle
        ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=outputs[0].device)
        self.saved = (pack, ws)

        def poison():
            for x in outputs:
                if x.element_size() == 1:  # an e4m3 O: 0x7f is e4m3fn's NaN, written as bytes by any torch
                    x.view(torch.uint8).fill_(0x7F)
                else:
                    x.fill_(float("nan"))
        self.poison = poison
        ret = outputs[0] if len(outputs) == 1 else outputs
        cuda = outputs[0].is_cuda  # (CPU buffers: the tests, with a stand-in for execute)

        def call():
            cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream if cuda else 0)
            g.execute(pack, ws, handle=handle)
            return ret
        return call

    def build(self, q, k, v):
        torch, cudnn, p = self.torch, self.cudnn, self.p
        spec = graph_spec(p)
        try:  # the frontend imports without cuDNN itself, which it loads here
            backend = cudnn.backend_version()
            self.handle = cudnn.create_handle()
        except Exception as e:
            raise ValueError("the cuDNN frontend cannot load cuDNN ({}); it takes the cuDNN torch ships (import "
                             "torch first, as peers.py does) or one on the library path".format(first_line(e)))
        self.extra.update({"peer_frontend": getattr(cudnn, "__version__", None), "peer_cudnn": backend,
                           "peer_causal": spec["align"].lower() if p["causal"] else "none"})
        q, k, v = (self._as(x, spec[n]) for x, n in ((q, "q"), (k, "k"), (v, "v")))
        if self.name == "cudnn_fp8":
            return self.build_fp8(spec, q, k, v)
        g, t = build_graph(cudnn, spec, "sdpa")
        self.extra["peer_plan"] = self._plan(g)
        o = self._empty(spec["o"], q.dtype, q.device)
        stats = self._empty(spec["stats"], torch.float32, q.device)
        pack = {t["q"]: q, t["k"]: k, t["v"]: v, t["o"]: o, t["stats"]: stats}
        fwd = self._runner(g, pack, (o,))
        if not is_bwd(p):
            self.saved += (stats,)
            return fwd
        # The backward: O and the statistics of one untimed forward, then the timed backward graph.
        fwd()
        fwd_saved = self.saved
        gb, tb = build_graph(cudnn, spec, "sdpa_backward")
        self.extra["peer_plan_bwd"] = self._plan(gb)
        self.extra["peer_deterministic"] = False
        dout = self._as(self.inputs.dout, spec["dO"])
        grads = tuple(self._empty(spec[n], q.dtype, q.device) for n in ("dQ", "dK", "dV"))
        pack = {tb["q"]: q, tb["k"]: k, tb["v"]: v, tb["o"]: o, tb["dO"]: dout, tb["stats"]: stats,
                tb["dQ"]: grads[0], tb["dK"]: grads[1], tb["dV"]: grads[2]}
        bwd = self._runner(gb, pack, grads)
        self.saved += (fwd_saved, stats)
        self.bwd_o = o  # the backward graph reads this O (its D = rowsum(dO * O))
        self.extra["bwd_inputs"] = "O and statistics of its own forward (the reference gradients are of that O)"
        return bwd

    def build_fp8(self, spec, q, k, v):
        """cuDNN's FP8 forward on Q, K, V quantized per tensor from the problem's values (see the module's
        docstring); self.ref_values are the values it computes on, which the check compares against."""
        torch, cudnn = self.torch, self.cudnn
        codes, descales = zip(*(requantize_per_tensor(torch, val, x) for val, x in zip(self.inputs.values,
                                                                                      (q, k, v))))
        self.ref_values = tuple(c.float() * d for c, d in zip(codes, descales))
        one = lambda x: torch.full((1, 1, 1, 1), x, dtype=torch.float32, device=q.device)
        scalars = dict(zip(("descale_q", "descale_k", "descale_v"), descales))
        so = o_scale(torch, self.ref_values[2])
        scalars.update(descale_s=one(1.0 / FP8_P_SCALE), scale_s=one(FP8_P_SCALE), scale_o=so)
        self.o_descale = 1.0 / so  # the check reads O as its codes times this (runner, reference_check)
        g, t = build_graph(cudnn, spec, "sdpa_fp8")
        self.extra.update({"peer_plan": self._plan(g), "peer_descale": "per_tensor",
                           "peer_descale_note": "Q, K, V requantized with one descale per tensor from the per-block "
                                                "values; verified against the reference of the values it was given",
                           "peer_p_scale": FP8_P_SCALE, "peer_o_dtype": "e4m3", "peer_o_scale": float(so),
                           "peer_o_note": "O written in e4m3 (cuDNN's FP8 forward writes bf16 only on Blackwell): "
                                          "one byte per element where ours write bf16, which favours the peer; "
                                          "verified as its codes times 1/peer_o_scale"})
        o = self._empty(spec["o"], torch.float8_e4m3fn, q.device)
        stats = self._empty(spec["stats"], torch.float32, q.device)
        amax = [one(0.0), one(0.0)]
        pack = {t["q"]: codes[0], t["k"]: codes[1], t["v"]: codes[2], t["o"]: o, t["stats"]: stats,
                t["amax_s"]: amax[0], t["amax_o"]: amax[1]}
        pack.update({t[n]: x for n, x in scalars.items()})
        call = self._runner(g, pack, (o,))
        self.saved += (codes, scalars, stats, amax)
        return call

    def close(self):
        if self.handle is not None:
            if self.saved and self.saved[1].is_cuda:
                self.torch.cuda.synchronize()
            self.saved = self.bwd_o = None
            try:
                self.cudnn.destroy_handle(self.handle)
            except Exception:  # the frontend's own exit handler may have destroyed it already
                pass
            self.handle = None
