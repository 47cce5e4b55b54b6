#!/usr/bin/env python3
"""Does the placement of a variant's buffers change its time inside the torch process? (fa3 NOTES.md, session 31:
the causal d128 N512 kernel, DRAM-bound on an H100, runs ~2 us slower in peers.py than in flashbench, though ncu
times it equal to cuDNN's.) Times, sample by sample in one loop (peers.py's Timer.measure_many), the variant at CONFIG
on the plan's problems with
  torch:    peers.py's inputs and outputs (torch's caching allocator, as peers.py --ours runs it),
  aligned:  Q, K, V copied into 2-MiB-aligned slabs and O, LSE in 2-MiB-aligned slabs (as flashbench's cudaMallocs),
  in_aligned: the aligned inputs, torch's O and LSE,
and torch SDPA's cuDNN backend on torch's inputs; each verified against the float64 reference first.

  python3 scripts/dev/placement_probe.py PLAN.json build/libflashbench_capi.so VARIANT CONFIG [ROUNDS]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import peers  # noqa: E402

MB2 = 2 << 20


def slab_like(torch, t, keep):
    """An uninitialised tensor shaped and strided like t, its storage starting on a 2-MiB boundary."""
    n = t.untyped_storage().nbytes()
    slab = torch.empty(n + MB2, dtype=torch.uint8, device="cuda")
    keep.append(slab)
    off = (-slab.data_ptr()) % MB2
    return torch.as_strided(slab[off:off + n].view(t.dtype), t.shape, t.stride())


class Placed(peers.Ours):
    """peers.Ours whose O and LSE live in 2-MiB-aligned slabs."""

    def make_outputs(self, q):
        self.keep = []
        return tuple(slab_like(self.torch, t, self.keep) for t in super().make_outputs(q))


def main():
    plan, lib_path, variant, config = sys.argv[1:5]
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    import torch
    problems, _, timing = peers.load_plan(plan)
    args = argparse.Namespace(**{k: None for k in peers.TIMING_FIELDS})
    peers.resolve_timing(args, timing)
    dev = peers.device_info(torch)
    timer = peers.Timer(torch, args, dev.get("l2_bytes") or (64 << 20),
                        peers.Nvml(dev.get("pci_bus_id"), torch.cuda.current_device()), dev.get("sm_clock_max_mhz") or 0)
    lib = peers.CapiLib(lib_path)
    for i, p in enumerate(problems):
        q, k, v = peers.make_inputs(torch, p, 1234 + i, "cuda")
        keep = []
        qa, ka, va = (slab_like(torch, t, keep) for t in (q, k, v))
        for a, t in zip((qa, ka, va), (q, k, v)):
            a.copy_(t)
        arms = [("torch", peers.Ours(torch, lib, variant, config, p), (q, k, v)),
                ("aligned", Placed(torch, lib, variant, config, p), (qa, ka, va)),
                ("in_aligned", peers.Ours(torch, lib, variant, config, p), (qa, ka, va)),
                ("cudnn", peers.Peer(torch, "torch_cudnn", p), (q, k, v))]
        fns, names = [], []
        for name, pe, inputs in arms:
            rec, r = peers.prepare_peer(torch, pe, inputs, 1234 + i, True, True)
            if rec:
                print(name, rec["status"], rec["reason"])
                continue
            fns.append(r[0])
            names.append(name)
            outs = getattr(pe, "outputs", ())
            print("{:<10} check {}  Q K V O LSE at 2-MiB offsets {}".format(
                name, r[1].get("max_error"), [t.data_ptr() % MB2 for t in (*inputs, *outs)]))
        label = "d{} N{}{}".format(p["head_dim"], p["seqlen_q"], " causal" if p["causal"] else "")
        for rnd in range(rounds):
            stats = timer.measure_many(fns)
            print(label, "round", rnd, "  ".join("{} {:.2f} (min {:.2f}, {} MHz)".format(
                n, s["median_us"], s["min_us"], s.get("sm_clock_mhz")) for n, s in zip(names, stats)), flush=True)
        for _, pe, _ in arms:
            pe.close()
        del keep
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
