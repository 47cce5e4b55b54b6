"""What this torch offers for FP8 attention (the peer fa3_fp8 would be compared with): prints torch's and cuDNN's
versions, whether
torch.nn.attention.experimental._scaled_dot_product_attention_quantized exists and which descale types it has, and
tries it (and plain SDPA on float8 inputs under the cuDNN backend) on one small problem. Feasibility only: nothing it
prints is a timing."""
import traceback

import torch


def attempt(what, fn):
    try:
        out = fn()
        torch.cuda.synchronize()
        print("  {}: ran, out {} {}".format(what, tuple(out.shape), out.dtype))
    except Exception as e:
        print("  {}: {}: {}".format(what, type(e).__name__, str(e).splitlines()[0][:300] if str(e) else ""))


print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), "device", torch.cuda.get_device_name())
B, H, S, D = 1, 4, 256, 128
q, k, v = (torch.randn(B, H, S, D, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
ds = torch.ones(B, H, device="cuda", dtype=torch.float32)
try:
    import torch.nn.attention.experimental._scaled_dot_product_attention_quantized as m
    print("quantized SDPA: present; DescaleType:", [d.name for d in m.DescaleType])
    f = m._scaled_dot_product_attention_quantized
    attempt("PER_HEAD", lambda: f(q, k, v, is_causal=False, q_descale=ds, k_descale=ds, v_descale=ds))
    if hasattr(m.DescaleType, "PER_TENSOR"):
        t = torch.ones(1, 1, 1, 1, device="cuda")
        pt = m.DescaleType.PER_TENSOR
        attempt("PER_TENSOR", lambda: f(q, k, v, q_descale=t, k_descale=t, v_descale=t, q_descale_type=pt,
                                        k_descale_type=pt, v_descale_type=pt))
except Exception:
    print("quantized SDPA: not importable:", traceback.format_exc().splitlines()[-1])
try:
    from torch.nn.attention import activate_flash_attention_impl  # noqa: F401
    print("activate_flash_attention_impl: present")
except Exception as e:
    print("activate_flash_attention_impl: absent ({})".format(e))
from torch.nn.attention import SDPBackend, sdpa_kernel
for b in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
    def call(b=b):
        with sdpa_kernel([b]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    attempt("SDPA float8 " + b.name, call)
try:
    import cudnn
    print("cudnn frontend (python):", cudnn.__version__)
except Exception as e:
    print("cudnn frontend (python): absent ({})".format(e))
a = torch.randn(1024, 1024, device="cuda").to(torch.float8_e4m3fn)
one = torch.ones((), device="cuda")
attempt("torch._scaled_mm e4m3", lambda: torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
