"""The peers: torch SDPA's flash, cuDNN and efficient backends, FlexAttention and torch's FP8 SDPA, each bound to a
problem (`make_peer(torch, name, p).build(q, k, v)` -> a call returning O as [B, Hq, Sq, D], or on a backward
problem (dQ, dK, dV)); the inputs they share (make_inputs, e4m3 quantized as the harness's; dO for the backward) and
the float64 reference check of the forward (backward.py checks the gradients). The cuDNN frontend's peers
(cudnn_fe, cudnn_fp8) are in cudnn_fe.py. torch is passed in, never imported here, so that the module loads where
torch is absent.
"""
from __future__ import annotations

import contextlib
import math

from ..problem import E4M3_P_ROUND, E4M3_REL_L2, FP8_SCALE_BLOCK, TOLERANCE
from .backward import BwdInputs, is_bwd


PEERS = ("torch_flash", "torch_cudnn", "torch_efficient", "flex", "torch_fp8", "cudnn_fe", "cudnn_fp8")
# The peers that time a backward problem (pass bwd); the others are skipped there with a reason.
BWD_PEERS = ("torch_flash", "torch_cudnn", "torch_efficient", "cudnn_fe")
FP8_PEERS = ("torch_fp8", "cudnn_fp8")


def make_peer(torch, name: str, p: dict) -> "Peer":
    """The peer NAME (one of PEERS) bound to problem p."""
    if name in ("cudnn_fe", "cudnn_fp8"):
        from .cudnn_fe import CudnnFe
        return CudnnFe(torch, name, p)
    return Peer(torch, name, p)


def first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return "{}: {}".format(type(e).__name__, msg[0] if msg else "")[:300]


class Peer:
    """One peer bound to a problem: build(q, k, v) -> fn() returning O in [B, Hq, Sq, D], or on a backward problem
    (dQ, dK, dV) as [B, H, S, D]: the forward through autograd, run once beforehand (untimed), and fn() its
    backward alone (torch.autograd.grad with retain_graph, so that every call runs the same backward)."""
    config = ""    # a catalog variant's config string (Ours); peers have none
    poison = None  # Ours: overwrites the outputs fn() writes in place, before a graph replay is compared
    saved = None  # a backward's forward outputs and leaves (build_bwd)
    bwd_o = None  # the O a backward reads, where not the reference forward's: its own forward's (build_bwd)

    def __init__(self, torch, name: str, p: dict):
        self.torch, self.name, self.p = torch, name, p
        self.extra = {}

    def skip_reason(self):
        p = self.p
        if p.get("kv_lens"):
            return "per-entry KV lengths (kv_lens) are not modelled for torch peers (SDPA has no cache_seqlens)"
        if p.get("page_size"):
            return "paged KV caches are not modelled for torch peers (SDPA reads contiguous K/V)"
        if self.name == "torch_flash" and p["dtype"] == "fp32":
            return "torch flash backend needs fp16 or bf16 inputs"
        if self.name == "torch_cudnn" and p["dtype"] == "fp32":
            return "torch cuDNN backend needs fp16 or bf16 inputs"
        if is_bwd(p) and self.name not in BWD_PEERS:
            return "{}: its backward is not timed by peers.py (backward peers: {})".format(
                self.name, ", ".join(BWD_PEERS))
        if (self.name in FP8_PEERS) != (p["dtype"] == "e4m3"):
            return "{} takes e4m3 problems only".format(self.name) if self.name in FP8_PEERS else \
                "e4m3 inputs with per-block descales: the FP8 peers for them are " + ", ".join(FP8_PEERS)
        return None

    def build(self, q, k, v):
        if is_bwd(self.p):
            return self.build_bwd(q, k, v)
        return self.build_fwd(q, k, v)

    def build_bwd(self, q, k, v):
        """The backward through autograd: the forward (build_fwd) runs once here on q, k and v as leaves that need
        gradients, with dO laid out like its O (a backend would copy a dO of other strides inside the timed call);
        fn() is torch.autograd.grad(O, (q, k, v), dO, retain_graph=True), whatever backward the forward's backend
        recorded (GQA's sum over the group included). The forward runs on a side stream: autograd runs each
        backward kernel on its forward's stream, ordered after and before the caller's stream by events, which
        joins it into a CUDA graph captured on any stream; the legacy default stream could not be joined."""
        torch = self.torch
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        fwd = self.build_fwd(*leaves)
        stream = torch.cuda.Stream() if q.is_cuda else None  # (CPU: the tests)
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            out = fwd()
            dout = torch.empty_like(out).copy_(self.inputs.dout)
        if stream is not None:
            torch.cuda.current_stream().wait_stream(stream)
        self.saved = (out, dout, leaves, stream)  # alive as long as the call is
        self.bwd_o = out  # autograd's backward reads the O its forward saved
        self.extra["peer_backward"] = "torch.autograd.grad(retain_graph=True) after an untimed forward"
        self.extra["bwd_inputs"] = "O of its own forward (the reference gradients are of that O)"
        grad = torch.autograd.grad

        def call():
            return grad(out, leaves, dout, retain_graph=True)
        return call

    def close(self):
        self.saved = self.bwd_o = None

    def build_fwd(self, q, k, v):
        torch, p = self.torch, self.p
        scale = p["scale"] or None
        gqa = p["heads_q"] != p["heads_kv"]
        if self.name == "torch_fp8":
            return self.build_fp8(q, k, v, scale)
        if self.name == "flex":
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            # A fresh compile per problem: past dynamo's recompile limit (8 shapes) torch silently falls back
            # to eager flex_attention, which is tens of times slower and would misrepresent the peer.
            torch._dynamo.reset()
            fn = torch.compile(flex_attention, dynamic=False)
            block_mask = None
            if p["causal"]:
                off = p["seqlen_kv"] - p["seqlen_q"]

                def bottom_right(b, h, q_idx, kv_idx):
                    return kv_idx <= q_idx + off
                block_mask = create_block_mask(bottom_right, B=None, H=None, Q_LEN=p["seqlen_q"],
                                               KV_LEN=p["seqlen_kv"], device=q.device)
            kwargs = {"block_mask": block_mask, "scale": scale}
            if gqa:
                kwargs["enable_gqa"] = True
            self.extra["peer_causal"] = "block_mask_bottom_right" if p["causal"] else "none"
            return lambda: fn(q, k, v, **kwargs)

        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"torch_flash": SDPBackend.FLASH_ATTENTION, "torch_cudnn": SDPBackend.CUDNN_ATTENTION,
                   "torch_efficient": SDPBackend.EFFICIENT_ATTENTION}[self.name]
        F = torch.nn.functional
        kwargs = {"scale": scale}
        if gqa:
            kwargs["enable_gqa"] = True
        if p["causal"] and p["seqlen_q"] == p["seqlen_kv"]:
            kwargs["is_causal"] = True
            self.extra["peer_causal"] = "is_causal"
        elif p["causal"]:
            from torch.nn.attention.bias import causal_lower_right
            kwargs["attn_mask"] = causal_lower_right(p["seqlen_q"], p["seqlen_kv"])
            self.extra["peer_causal"] = "causal_lower_right"
        else:
            self.extra["peer_causal"] = "none"

        def call():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
        return call


    def build_fp8(self, q, k, v, scale):
        """torch's FP8 SDPA (torch.nn.attention.experimental._scaled_dot_product_attention_quantized) on the same
        e4m3 codes as ours. Its descales are per (batch, kv head) (FA3's backend) or per tensor (cuDNN's, in later
        torch), not per 128-token block: each block's descale is replaced by its head's largest (per head) or the
        tensor's (per tensor), and the check compares with the reference of those values (self.ref_values)."""
        torch, p = self.torch, self.p
        import torch.nn.attention.experimental._scaled_dot_product_attention_quantized as m
        if not hasattr(m.DescaleType, "PER_TENSOR"):
            # torch 2.11: FA3's backend only, which needs the flash_attn_3 package; its error names what is missing
            try:
                torch.nn.attention.activate_flash_attention_impl("FA3")
            except Exception as e:
                raise ValueError("torch_fp8 (torch {}): per-head FP8 SDPA needs the FA3 backend, and "
                                 "activate_flash_attention_impl('FA3') failed: {}".format(torch.__version__,
                                                                                        first_line(e)))
        qd, kd, vd = self.inputs.descales
        if hasattr(m.DescaleType, "PER_TENSOR"):
            kind = m.DescaleType.PER_TENSOR
            ds = [d.amax().reshape(1, 1, 1, 1) for d in (qd, kd, vd)]
            per = [d.reshape(1, 1, 1) for d in ds]
            self.extra["peer_descale"] = "per_tensor"
        else:
            kind = m.DescaleType.PER_HEAD
            # q_descale is (batch, kv heads) too: one per GQA group, as torch documents
            grp = p["heads_q"] // p["heads_kv"]
            qh = qd.amax(dim=2).reshape(p["batch"], p["heads_kv"], grp).amax(dim=2)
            ds = [qh.contiguous(), kd.amax(dim=2).contiguous(), vd.contiguous()]
            per = [qh.repeat_interleave(grp, dim=1)[:, :, None], ds[1][:, :, None], ds[2][:, :, None]]
            self.extra["peer_descale"] = "per_head"
        self.ref_values = tuple(c.float() * d[:, :, :, None] for c, d in zip((q, k, v), per))
        kwargs = {"is_causal": bool(p["causal"]), "scale": scale, "q_descale": ds[0], "k_descale": ds[1],
                  "v_descale": ds[2], "q_descale_type": kind, "k_descale_type": kind, "v_descale_type": kind}
        if p["causal"] and p["seqlen_q"] != p["seqlen_kv"]:
            raise ValueError("torch_fp8: is_causal is top-left aligned; seqlen_q != seqlen_kv is not modelled")
        self.extra["peer_causal"] = "is_causal" if p["causal"] else "none"
        f = m._scaled_dot_product_attention_quantized
        return lambda: f(q, k, v, **kwargs)


class Fp8Inputs(tuple):
    """e4m3 inputs: the (q, k, v) codes as SDPA's [B, H, S, D] views, with .descales (float32: Q [B, Hq, ceil(Sq /
    128)], K [B, Hkv, ceil(Skv / 128)], V [B, Hkv]) and .values (the dequantized float32 q, k, v, for the check)."""


def quantize_e4m3(torch, x, block: int):
    """x float32 [B, H, S, D] -> (codes [B, H, S, D] float8_e4m3fn, descale [B, H, ceil(S / block)]): per (batch,
    head, block of tokens) amax / 448, as flashbench's fill_quantized_e4m3."""
    B, H, S, D = x.shape
    nb = (S + block - 1) // block
    pad = torch.nn.functional.pad(x, (0, 0, 0, nb * block - S)).reshape(B, H, nb, block * D)
    amax = pad.abs().amax(dim=3)
    ds = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    codes = (pad / ds[..., None]).clamp(-448.0, 448.0).reshape(B, H, nb * block, D)[:, :, :S].to(torch.float8_e4m3fn)
    return codes, ds


def make_fp8_inputs(torch, p: dict, g, device):
    """Normal values with a magnitude drawn per 128-token block in [1/2, 2] (as flashbench's inputs), quantized per
    block (Q, K) and per head (V)."""
    B, Hq, Hkv, Sq, Skv, D = (p[k] for k in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim"))
    codes, descales, values = [], [], []
    for h, s, block in ((Hq, Sq, FP8_SCALE_BLOCK), (Hkv, Skv, FP8_SCALE_BLOCK), (Hkv, Skv, Skv)):
        nb = (s + block - 1) // block
        mag = torch.exp2(torch.rand(B, h, nb, generator=g, device=device) * 2 - 1)
        x = torch.randn(B, s, h, D, generator=g, device=device).transpose(1, 2)  # [B, H, S, D] view of bshd
        x = x * mag.repeat_interleave(block, dim=2)[:, :, :s, None]
        c, ds = quantize_e4m3(torch, x, block)
        if p["layout"] == "bshd":
            c = c.transpose(1, 2).contiguous().transpose(1, 2)
        values.append(c.float() * ds.repeat_interleave(block, dim=2)[:, :, :s, None])
        codes.append(c)
        descales.append(ds.contiguous())
    descales[2] = descales[2].reshape(B, Hkv).contiguous()  # one per (batch, kv head)
    out = Fp8Inputs(codes)
    out.descales, out.values = tuple(descales), tuple(values)
    return out


def make_inputs(torch, p: dict, seed: int, device):
    """(q, k, v) as SDPA's [B, H, S, D] views of the problem's layout, N(0, 1) in the problem's dtype (e4m3:
    make_fp8_inputs); a backward problem's also carry dO, drawn after them (BwdInputs)."""
    if p["dtype"] == "e4m3":
        return make_fp8_inputs(torch, p, torch.Generator(device=device).manual_seed(seed), device)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    g = torch.Generator(device=device).manual_seed(seed)
    B, Hq, Hkv, Sq, Skv, D = (p[k] for k in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim"))

    def t(h, s):
        x = torch.randn(B, s, h, D, generator=g, device=device, dtype=torch.float32).to(dtype)
        # bshd storage viewed as SDPA's [B, H, S, D], as flashbench's kernels see it; bhsd is contiguous
        return x.transpose(1, 2) if p["layout"] == "bshd" else x.transpose(1, 2).contiguous()
    qkv = (t(Hq, Sq), t(Hkv, Skv), t(Hkv, Skv))
    if is_bwd(p):
        return BwdInputs(qkv).setup(torch, p, t(Hq, Sq))
    return qkv


# O written in e4m3 (cudnn_fp8) and read as code * o_descale: round to nearest, 3 mantissa bits, rounds a normal
# code by at most 2^-4 of its magnitude, a subnormal one (below 2^-6) by at most half its step 2^-9.
E4M3_O_ROUND = 2.0 ** -4
E4M3_O_SUBNORMAL = 2.0 ** -10


def reference_check(torch, p: dict, q, k, v, out, o_descale=None) -> dict:
    """float64 reference on the GPU, one (batch, head) at a time to bound memory. o_descale: out is an e4m3 O's
    codes times o_descale; the bound adds that rounding, max(E4M3_O_ROUND * |out|, E4M3_O_SUBNORMAL * o_descale)
    per element, and its L2 norm over the reference's to the norm bound."""
    atol, rtol = TOLERANCE[p["dtype"]]
    ods = None if o_descale is None else float(o_descale)
    o_num = 0.0
    scale = p["scale"] or 1.0 / math.sqrt(p["head_dim"])
    grp = p["heads_q"] // p["heads_kv"]
    Sq, Skv = p["seqlen_q"], p["seqlen_kv"]
    max_err, worst, num, den, bad = 0.0, 0.0, 0.0, 0.0, 0
    mask = None
    if p["causal"]:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Skv, device=q.device)[None, :]
        mask = j <= i + (Skv - Sq)
    for b in range(p["batch"]):
        for h in range(p["heads_q"]):
            qq = q[b, h].double()
            kk, vv = k[b, h // grp].double(), v[b, h // grp].double()
            s = (qq @ kk.T) * scale
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            m = s.amax(dim=1, keepdim=True)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e = torch.exp(s - m)
            l = e.sum(dim=1, keepdim=True)
            ref = torch.where(l > 0, (e @ vv) / l.clamp_min(1e-300), torch.zeros_like(qq))  # fully masked row -> 0
            o = out[b, h].double()
            diff = (o - ref).abs()
            diff = torch.where(torch.isfinite(o), diff, torch.full_like(diff, float("inf")))
            max_err = max(max_err, float(diff.max()))
            bound = atol + rtol * ref.abs()
            if p["dtype"] == "e4m3":  # P rounded to e4m3: up to E4M3_P_ROUND of the softmax-weighted |V|
                bound = bound + E4M3_P_ROUND * (e @ vv.abs()) / l.clamp_min(1e-300)
            if ods is not None:
                o_round = torch.clamp_min(E4M3_O_ROUND * o.abs(), E4M3_O_SUBNORMAL * ods)
                o_round = torch.where(torch.isfinite(o_round), o_round, torch.zeros_like(o_round))
                bound = bound + o_round
                o_num += float((o_round ** 2).sum())
            bad += int((diff > bound).sum())
            num += float((diff[torch.isfinite(diff)] ** 2).sum()) + (float("inf") if not torch.isfinite(diff).all() else 0)
            den += float((ref ** 2).sum())
    rel_l2 = math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else float("inf"))
    # O's rounding to e4m3 adds at most the norm of its per-element bound (triangle inequality)
    rel_l2_bound = E4M3_REL_L2 + (math.sqrt(o_num / den) if den > 0 else 0.0)
    if p["dtype"] == "e4m3" and not rel_l2 <= rel_l2_bound:
        bad += 1  # the norm bound (flashbench's Tolerance::rel_l2)
    res = {"max_error": max_err if math.isfinite(max_err) else None,
           "rel_l2_error": rel_l2 if math.isfinite(rel_l2) else None, "verified_against": "gpu_f64",
           "tolerance": {"atol": atol, "rtol": rtol}}
    if ods is not None:
        res["tolerance"].update({"o_e4m3_round": E4M3_O_ROUND, "o_e4m3_subnormal": E4M3_O_SUBNORMAL * ods,
                                 "rel_l2": rel_l2_bound})
    res["_bad"] = bad
    return res
