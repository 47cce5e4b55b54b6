#!/usr/bin/env python3
"""One torch SDPA call inside an NVTX range "probe", for ncu to profile the peer's kernel alone (its name, which
encodes cuDNN's tile and cluster shape, its launch configuration and its counters). The FA3 acceptance
shapes: B*N = 16384 tokens, H*d = 2048, bf16, bshd storage as flashbench and scripts/peers.py use.

  ncu --nvtx --nvtx-include "probe/" -c 1 --section LaunchStats python3 tools/dev/peer_probe.py 128 512 0 cudnn
  args: HEAD_DIM SEQLEN CAUSAL(0|1) BACKEND(cudnn|flash)
"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

d, n, causal, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
b, h = 16384 // n, 2048 // d
q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[name]
with sdpa_kernel([backend]):
    for _ in range(3):  # plan building and autotuning happen here, outside the range
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("probe")
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
print("ok", d, n, causal, name, float(o.float().abs().mean()))
