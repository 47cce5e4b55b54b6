"""A catalog variant timed by the peers' timer: libflashbench_capi.so (harness/capi, flashbench/capi.h) loaded
through ctypes (CapiLib), and a variant at one config bound to a problem (Ours, a Peer), launched on torch's
stream over torch's tensors. Two builds' libraries load side by side (each CapiLib is its own dlopen of its own
path), so one process can time build A against build B with Timer.measure_many.
"""
from __future__ import annotations

import json
import os

from ..problem import UserError, normalize_problem, problem_key
from .backends import Peer
from .backward import is_bwd


class CapiLib:
    """libflashbench_capi.so (harness/capi, flashbench/capi.h) through ctypes: a catalog variant launched on torch's
    stream over torch's tensors, so that this script times it with the peers' timer, in the same process."""

    def __init__(self, path: str):
        import ctypes
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise UserError("--lib {}: cannot load it ({}); build it with 'cmake --build build --target "
                            "flashbench_capi'".format(path, str(e).splitlines()[0]))
        self.path = os.path.abspath(path)
        P = ctypes.c_void_p
        lib.fb_capi_create.restype, lib.fb_capi_create.argtypes = P, [ctypes.c_char_p] * 3
        lib.fb_capi_config_string.restype, lib.fb_capi_config_string.argtypes = ctypes.c_char_p, [P]
        lib.fb_capi_launch.restype, lib.fb_capi_launch.argtypes = ctypes.c_int, [P] * 7
        lib.fb_capi_set_descales.restype, lib.fb_capi_set_descales.argtypes = ctypes.c_int, [P] * 4
        lib.fb_capi_destroy.restype, lib.fb_capi_destroy.argtypes = None, [P]
        lib.fb_capi_last_error.restype, lib.fb_capi_last_error.argtypes = ctypes.c_char_p, []
        # The backward (newer libraries only, as below): Ours says so on a backward problem when it is missing.
        self.has_backward = hasattr(lib, "fb_capi_launch_backward")
        if self.has_backward:
            lib.fb_capi_launch_backward.restype, lib.fb_capi_launch_backward.argtypes = ctypes.c_int, [P] * 11
        # What "auto" chose (newer libraries only: an A/B against an older build's library still loads it).
        self.has_choice = hasattr(lib, "fb_capi_variant") and hasattr(lib, "fb_capi_choice")
        if self.has_choice:
            lib.fb_capi_variant.restype, lib.fb_capi_variant.argtypes = ctypes.c_char_p, [P]
            lib.fb_capi_choice.restype, lib.fb_capi_choice.argtypes = ctypes.c_char_p, [P]
        # The build the library was made from (newer libraries only): results name it, not this checkout's HEAD.
        self.build = None
        if hasattr(lib, "fb_capi_build"):
            lib.fb_capi_build.restype, lib.fb_capi_build.argtypes = ctypes.c_char_p, []
            self.build = json.loads(lib.fb_capi_build().decode())
        self.lib = lib

    def error(self) -> str:
        return self.lib.fb_capi_last_error().decode()


class Ours(Peer):
    """A catalog variant at one config (--ours), bound to a problem. Its output and LSE are poisoned (NaN) before the
    verified call and before a graph replay is compared with it. On a backward problem (a backward variant, e.g.
    fa2_bwd) it launches fb_capi_launch_backward with O and LSE of the reference forward, the problem's dO and
    dQ, dK, dV of its own (poisoned alike), and returns (dQ, dK, dV). Variant "auto" (config "auto") is the library's own
    choice, what flashbench::attention_forward runs: its records are named "auto" with the chosen config, and carry
    the chosen variant (chosen_variant) and why (choice: the tuning table's bucket, or the heuristic)."""

    def __init__(self, torch, lib: CapiLib, variant: str, config: str, p: dict):
        super().__init__(torch, variant, p)
        self.lib, self.config, self.handle, self.outputs = lib, config, None, ()
        self.extra["capi_lib"] = lib.path  # which build timed it, where two libraries are timed in turn (A/B)

    def skip_reason(self):
        if self.config is None:
            return "no config of {} for this problem in --ours-best's results".format(self.name)
        if self.p.get("kv_lens") or self.p.get("page_size"):
            return "per-entry KV lengths and paged caches are not modelled by peers.py's inputs"
        return None

    def build(self, q, k, v):
        torch, p = self.torch, self.p
        fields = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim", "causal", "dtype", "layout",
                  "scale") + (("pass",) if is_bwd(p) else ())
        problem = json.dumps({f: p[f] for f in fields})
        if is_bwd(p) and not self.lib.has_backward:
            raise ValueError("{} has no fb_capi_launch_backward: a library older than the backward".format(
                self.lib.path))
        h = self.lib.lib.fb_capi_create(self.name.encode(), self.config.encode(), problem.encode())
        if not h:
            raise ValueError(self.lib.error())
        self.handle = h
        self.config = self.lib.lib.fb_capi_config_string(h).decode()
        if self.lib.has_choice:
            self.extra["chosen_variant"] = self.lib.lib.fb_capi_variant(h).decode()
            self.extra["choice"] = self.lib.lib.fb_capi_choice(h).decode()
        elif self.name == "auto":
            raise ValueError("{} has no fb_capi_variant: a library older than variant auto".format(self.lib.path))
        if p["dtype"] == "e4m3":
            ds = self.inputs.descales  # kept alive by self.inputs while the launcher is
            if self.lib.lib.fb_capi_set_descales(h, *(d.data_ptr() for d in ds)) != 0:
                raise ValueError(self.lib.error())
        if is_bwd(p):
            return self.build_bwd_launch(h, q, k, v)
        o, lse = self.outputs = self.make_outputs(q)
        self.poison()
        launch, lib, ptrs = self.lib.lib.fb_capi_launch, self.lib, (q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                                 o.data_ptr(), lse.data_ptr())

        def call():
            if launch(h, *ptrs, torch.cuda.current_stream().cuda_stream) != 0:
                raise RuntimeError(lib.error())
            return o
        return call

    def build_bwd_launch(self, h, q, k, v):
        """fb_capi_launch_backward's call: Q, K, V, O, dO and dQ, dK, dV bshd (the backward's only layout), LSE
        [B, Hq, Sq]."""
        torch = self.torch
        o, lse = self.inputs.forward()
        dout = self.inputs.dout
        grads = tuple(torch.empty_like(x) for x in (q, k, v))  # same strides: bshd storage, [B, H, S, D] views
        for x in (q, k, v, o, dout) + grads:
            if not x.transpose(1, 2).is_contiguous():
                raise ValueError("the backward takes bshd tensors; a [B, H, S, D] view has strides {}".format(
                    x.stride()))
        self.outputs = grads
        self.poison()
        launch, lib = self.lib.lib.fb_capi_launch_backward, self.lib
        ptrs = tuple(x.data_ptr() for x in (q, k, v, o)) + (lse.data_ptr(), dout.data_ptr()) + tuple(
            g.data_ptr() for g in grads)
        self.extra["bwd_inputs"] = "O and LSE of the reference forward"
        cuda = q.is_cuda  # (CPU tensors: the tests, with a stand-in library)

        def call():
            if launch(h, *ptrs, torch.cuda.current_stream().cuda_stream if cuda else None) != 0:
                raise RuntimeError(lib.error())
            return grads
        return call

    def make_outputs(self, q):
        """O (as SDPA's [B, Hq, Sq, D] view of the problem's layout) and LSE [B, Hq, Sq], from torch's allocator."""
        torch, p = self.torch, self.p
        B, Hq, Sq, D = p["batch"], p["heads_q"], p["seqlen_q"], p["head_dim"]
        dt = torch.bfloat16 if p["dtype"] == "e4m3" else q.dtype
        o = (torch.empty(B, Sq, Hq, D, dtype=dt, device=q.device).transpose(1, 2) if p["layout"] == "bshd"
             else torch.empty(B, Hq, Sq, D, dtype=dt, device=q.device))
        return o, torch.empty(B, Hq, Sq, dtype=torch.float32, device=q.device)

    def poison(self):
        for t in self.outputs:
            t.fill_(float("nan"))

    def close(self):
        if self.handle:
            if not self.outputs or self.outputs[0].is_cuda:
                self.torch.cuda.synchronize()
            self.lib.lib.fb_capi_destroy(self.handle)
            self.handle = None


def best_configs(path: str, variant: str, top: int = 1) -> dict:
    """problem_key -> the config strings of VARIANT's `top` fastest verified points in a `flashbench run` results
    file, fastest first, ranked by the fastest sample (min_us), not the median: under a power cap a point's median
    is set by the clock phase it drew (c157, H100 d128 N4096: the config fastest by median had run at 1980 MHz while
    four others ran at ~1700 MHz; by min_us another one was 5% faster), while the fastest sample was taken near the
    highest clock by every point that saw one. Time the `top` candidates interleaved (--interleave sample) to pick
    among them on equal terms."""
    try:
        with open(path) as f:
            records = json.load(f)["benchmarks"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError("--ours-best {}: cannot read a flashbench results file ({})".format(path, e))
    points = {}
    for r in records:
        if r.get("status") != "ok" or not r.get("tflops") or r.get("variant") != variant:
            continue
        us = r.get("min_us") or r.get("median_us") or r["flops"] / (r["tflops"] * 1e6)
        points.setdefault(problem_key(normalize_problem(r["problem"])), []).append((us, r["config_str"]))
    if not points:
        raise UserError("--ours-best {}: no verified point of {} in it".format(path, variant))
    return {k: [c for _, c in sorted(v)[:top]] for k, v in points.items()}
