"""peers.py: time torch SDPA (flash, cuDNN, efficient backends), FlexAttention, torch's FP8 SDPA and cuDNN through
its frontend (cudnn_fe: fp16/bf16, cudnn_fp8: e4m3; the optional nvidia-cudnn-frontend wheel) on flashbench problems
and write the records in flashbench's results-file schema (reports/SCHEMA.md), so reports put peers next to our
variants.

On a backward problem (pass: bwd) torch_flash, torch_cudnn, torch_efficient and cudnn_fe time the backward alone:
the forward runs once beforehand (untimed) and gives O and LSE; the timed call is torch.autograd.grad(O, (Q, K, V),
dO, retain_graph=True) (cudnn_fe: its sdpa_backward graph), captured in a CUDA graph like the forwards. dQ, dK and
dV are checked against the harness's backward reference and bound (float64; fp32 for large problems) on the same
Q, K, V and dO, with LSE of the reference forward and the O the peer's backward read (its own forward's: D =
rowsum(dO * O) is computed from it). `--ours fa2_bwd` times a backward variant through the C API
(fb_capi_launch_backward) on the reference forward's O and LSE. The other peers are skipped on backward problems,
with the reason.

  python scripts/peers.py --problems plan.json -o peers.json [--ceilings] [--peers torch_flash,flex]
  python scripts/peers.py --problems plan.json -o ab.json --peers torch_cudnn --ours fa3_pipelined \
      --ours-best results.json --rounds 3

With --ours, a catalog variant is timed here too (through libflashbench_capi.so, harness/capi), by the same timer,
in the same process and interleaved with the peers: each problem's peers and the variant in turn, --rounds times,
the order reversed every other round. A ratio of such records (scripts/peer_table.py ab.json) compares code under
the same power and thermal state, where a `flashbench run` and a peers.py run minutes apart may not (an H100 at its
700 W cap moves between 1980 and ~1700 MHz over seconds). --ours-best takes each problem's config from an earlier
sweep's results, so that the config is chosen on other samples than the ones compared; with --ours-top K its K
fastest (by fastest sample) are all timed, and scripts/peer_table.py picks one by its ratio in the first round and
reports its ratio over the later rounds. `--ours auto` times what a user of the library gets: per problem the
variant and config flashbench::attention_forward picks (this GPU's tuning table, else the heuristic), recorded as
variant "auto" with the chosen config, the chosen variant (chosen_variant) and why (choice):

  python scripts/peers.py --problems plan.json -o ab.json --peers torch_cudnn --ours auto --rounds 3 \
      --interleave sample

plan.json is {"problems": [...], "spec": {...}, "timing_policy": {...}} as written by `flashbench plan SPEC.yaml`;
--problems also takes the spec itself, planned here by the flashbench binary (--flashbench, else $FB_BUILD or
build/). --ours VARIANT without --ours-config or --ours-best runs each problem's default config:

  python scripts/peers.py --problems sweeps/accept/fa2-bwd.yaml -o ab.json --peers torch_flash --ours fa2_bwd
Measurement mirrors the harness, with the plan's timing policy: warm-up, then per sample an L2 flush (outside the
timed region) and a CUDA-event-timed call; the harness's stopping rule (noise target after min samples and min GPU
time, or the timeout); samples under 75% of the maximum clock dropped. Records carry the timed loop's busy
fraction and mean power, as the harness's do, so a ratio can be checked for equal load.
Each peer output is checked against a float64 reference before it is timed; a peer that fails is
`incorrect`, a combination a backend cannot run is `skipped` with the reason.

Causal masks are aligned bottom-right as in FlashAttention (query i sees key j iff j <= i + Skv - Sq).
torch's is_causal is top-left aligned, so it is used only when Sq == Skv; otherwise SDPA gets
torch's causal_lower_right bias and FlexAttention a bottom-right mask_mod.

scripts/peers.py runs from a plain checkout: it puts reports/ on sys.path and runs this package (no install
step), which imports only the standard library before torch. Without torch or a CUDA device it says so on one
line and exits 0 without writing a file.

The package, by role (for other tools, e.g. an A/B of two builds' C API libraries):
  timer     Timer (measure, measure_many), StoppingRule, sample_loop(_many), timing_args, Nvml
  backends  Peer (torch SDPA flash/cuDNN/efficient, flex, torch_fp8), make_peer, make_inputs, reference_check
  backward  BwdInputs (dO; the reference forward's O, LSE), reference_grads, grad_check, GRAD_TOLERANCE
  cudnn_fe  CudnnFe (cudnn_fe, cudnn_fp8 through the frontend's graph API), graph_spec, op_kwargs, build_graph
  capi      CapiLib (libflashbench_capi.so), Ours (a catalog variant at one config), best_configs
  runner    prepare_peer, time_peer, run_problem (rounds, interleave)
  records   record, write_atomic, append_partial, load_plan, git_sha
  device    device_info, measure_ceilings
  cli       main (scripts/peers.py)
The problem math (key, FLOPs, bytes, tolerances) is flashbench_reports.problem, shared with the reports.
"""
from ..problem import (DTYPE_BYTES, E4M3_P_ROUND, E4M3_REL_L2, FP8_SCALE_BLOCK, OUT_DTYPE, TOLERANCE,  # noqa: F401
                       UserError, bytes_min, flops, kv_bytes, normalize_problem, problem_key, unmasked_pairs)
from .backends import PEERS, Fp8Inputs, Peer, first_line, make_fp8_inputs, make_inputs, quantize_e4m3  # noqa: F401
from .backends import BWD_PEERS, make_peer, reference_check  # noqa: F401
from .backward import (GRAD_TOLERANCE, BwdInputs, GradReference, attend, grad_check, grads_close,  # noqa: F401
                       reference_forward, reference_grads)
from . import cudnn_fe, runner  # noqa: F401
from .capi import CapiLib, Ours, best_configs  # noqa: F401
from .device import device_info, measure_ceilings, nvidia_smi, sm_clock_mhz  # noqa: F401
from .records import SCHEMA_VERSION, append_partial, git_sha, load_plan, record, repo_root, write_atomic  # noqa: F401
from .runner import as_graph, prepare_peer, run_problem, time_peer  # noqa: F401
from .timer import (TIMING_FIELDS, Batch, Nvml, StoppingRule, Timer, VoidBatch, hold_us, power_w,  # noqa: F401
                    resolve_timing, sample_loop, sample_loop_many, summarize, timing_args)
