"""Facts about the GPU torch sees (name, clocks, L2, driver) and the ceilings measured through torch (bf16 and e4m3
GEMM, device copy) for the results' context.
"""
from __future__ import annotations

import argparse
import re
import subprocess

from .timer import Timer


def sm_clock_mhz(torch):
    try:
        return int(torch.cuda.clock_rate())  # needs pynvml; MHz
    except Exception:
        return None


def nvidia_smi(index: int) -> dict:
    try:
        out = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem,"
                              "pci.bus_id", "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20).stdout.strip().split(",")
        drv, sm, mem, bus = (x.strip() for x in out[:4])
        as_int = lambda x: int(x) if x.isdigit() else None
        return {"driver_version_string": drv or None, "sm_clock_max_mhz": as_int(sm), "mem_clock_max_mhz": as_int(mem),
                "pci_bus_id": bus or None}
    except Exception:
        return {}


def device_info(torch) -> dict:
    idx = torch.cuda.current_device()
    pr = torch.cuda.get_device_properties(idx)
    smi = nvidia_smi(idx)
    name = pr.name
    drv = smi.get("driver_version_string")
    bus = smi.get("pci_bus_id")
    if not bus and hasattr(pr, "pci_bus_id"):
        bus = "{:04x}:{:02x}:{:02x}.0".format(getattr(pr, "pci_domain_id", 0), pr.pci_bus_id, getattr(pr, "pci_device_id", 0))
    return {"name": name, "slug": re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"), "pci_bus_id": bus,
            "cc": "{}.{}".format(pr.major, pr.minor), "sm_count": pr.multi_processor_count,
            "l2_bytes": getattr(pr, "L2_cache_size", None), "total_mem_bytes": pr.total_memory,
            "sm_clock_max_mhz": smi.get("sm_clock_max_mhz") or (getattr(pr, "clock_rate", 0) // 1000 or None),
            "mem_clock_max_mhz": smi.get("mem_clock_max_mhz"),
            "mem_bus_width_bits": getattr(pr, "memory_bus_width", None),
            "driver_version": int(drv.split(".")[0]) * 1000 if drv and drv.split(".")[0].isdigit() else None,
            "driver_version_string": drv, "runtime_version": torch.version.cuda,
            "torch_version": torch.__version__}


def measure_ceilings(torch, args) -> dict:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    mm = Timer(torch, argparse.Namespace(**dict(vars(args), cold=False, min_samples=20, max_samples=200,
                                                min_time=0.5, timeout=10.0, max_noise=0.01)), 0)
    t_mm = mm.measure(lambda: torch.mm(a, b))["median_us"]
    # The e4m3 ceiling (the fa3_fp8 variant's GEMMs): torch._scaled_mm, e4m3 x e4m3 -> bf16, unit scales.
    fp8 = None
    try:
        a8, b8 = a.to(torch.float8_e4m3fn), b.t().contiguous().to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        t8 = mm.measure(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        fp8 = 2.0 * n ** 3 / (t8["median_us"] * 1e-6) / 1e12
        del a8, b8
    except Exception:  # an older torch or GPU without it: the ceiling is absent, not guessed
        pass
    del a, b
    copy_elems = 1 << 30  # 1 GiB each way, far larger than any L2
    src = torch.empty(copy_elems, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    t_cp = mm.measure(lambda: dst.copy_(src))["median_us"]
    del src, dst
    torch.cuda.empty_cache()
    return {"gemm_bf16_tflops": 2.0 * n ** 3 / (t_mm * 1e-6) / 1e12, "gemm_mnk": "{0}x{0}x{0}".format(n),
            "gemm_e4m3_tflops": fp8,
            "copy_gbps": 2.0 * copy_elems / (t_cp * 1e-6) / 1e9, "copy_bytes": 2 * copy_elems,
            "sm_clock_mhz": sm_clock_mhz(torch), "measured_by": "scripts/peers.py (torch.mm, Tensor.copy_)"}
