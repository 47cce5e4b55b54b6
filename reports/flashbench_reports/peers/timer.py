"""The peers' timer: the harness's measurement method (harness/include/flashbench/timing.hpp) and stopping rule
(harness/src/stopping.cpp) in torch terms. `Timer.measure(fn)` times one call; `Timer.measure_many(fns)` times
several in one loop, sample by sample in turn (`--interleave sample`), so that each was timed within a sample of
the others. Everything but Timer and Nvml runs without a GPU (reports/tests/test_peers_timing.py).
"""
from __future__ import annotations

import argparse
import math
import time


def summarize(samples):
    s = sorted(samples)
    n = len(s)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    mean = sum(s) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in s) / (n - 1)) if n > 1 else 0.0
    return {"median_us": med, "min_us": s[0], "max_us": s[-1], "mean_us": mean, "cv": sd / mean if mean else None}


# argparse name -> (the plan's timing_policy field, the harness's default in timing.hpp; warm-up is longer here
# because torch's first calls of a backend still select and cache kernels)
TIMING_FIELDS = {"warmup": ("warmup_runs", 10), "min_samples": ("min_samples", 10), "max_samples": ("max_samples", 100000),
                 "min_time": ("min_time_s", 0.5), "timeout": ("timeout_s", 15.0), "max_noise": ("max_noise", 0.005),
                 "settle": ("settle_s", 2.0), "cold": ("cold", True), "flush": ("flush", "read"),
                 "throttle_fraction": ("throttle_fraction", 0.75), "queue": ("queue", "round_trip")}


def resolve_timing(args, plan_timing: dict) -> None:
    """Fills each timing option not given on the command line from the plan's timing_policy, else the default."""
    warmup_given = getattr(args, "warmup", None) is not None
    for name, (field, default) in TIMING_FIELDS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, type(default)(plan_timing.get(field, default)))
    if not warmup_given:
        args.warmup = max(args.warmup, TIMING_FIELDS["warmup"][1])


def timing_args(plan_timing: dict = None, **given) -> argparse.Namespace:
    """The policy Timer reads, as resolve_timing fills it for the command line: each field `given` (argparse
    names: warmup, min_samples, max_samples, min_time, timeout, max_noise, settle, cold, flush, throttle_fraction,
    queue) wins, then the plan's timing_policy, then the harness's default."""
    unknown = set(given) - set(TIMING_FIELDS)
    if unknown:
        raise TypeError("timing_args: unknown fields {}; use {}".format(sorted(unknown), ", ".join(TIMING_FIELDS)))
    args = argparse.Namespace(**{n: given.get(n) for n in TIMING_FIELDS})
    resolve_timing(args, plan_timing or {})
    return args


class StoppingRule:
    """harness/src/stopping.cpp's rule, sample for sample: stop at max_samples; or once there are min_samples, at
    least min_time_s of GPU time (the samples' sum, not wall time) and a relative stdev <= max_noise; or at the
    timeout (wall time) once there are min(min_samples, 3). Running sums keep each add() O(1): a rule that
    re-summarised every sample cost milliseconds of host time per sample after a few thousand samples, which left
    the GPU idle a growing share of the loop, and an idler GPU runs cooler and clocks higher than the harness's."""

    def __init__(self, min_samples: int, max_noise: float, min_time_s: float, timeout_s: float, max_samples: int):
        self.min_samples, self.max_noise = min_samples, max_noise
        self.min_time_s, self.timeout_s, self.max_samples = min_time_s, timeout_s, max_samples
        self.samples, self.reason = [], ""
        self._sum = self._sum_sq = 0.0

    def cv(self):
        n = len(self.samples)
        if n < 2 or self._sum <= 0:
            return None
        mean = self._sum / n
        var = max(0.0, (self._sum_sq - n * mean * mean) / (n - 1))
        return math.sqrt(var) / mean

    def timed_out(self, wall_s: float) -> bool:
        return wall_s >= self.timeout_s

    def add(self, sample_us: float, wall_s: float) -> bool:
        self.samples.append(sample_us)
        self._sum += sample_us
        self._sum_sq += sample_us * sample_us
        n = len(self.samples)
        if n >= self.max_samples:
            self.reason = "max_samples"
            return True
        cv = self.cv()
        if n >= self.min_samples and self._sum * 1e-6 >= self.min_time_s and cv is not None and cv <= self.max_noise:
            self.reason = "noise"
            return True
        if self.timed_out(wall_s) and n >= min(self.min_samples, 3):
            self.reason = "timeout"
            return True
        return False


class Batch(list):
    """One batch's samples in us; `who` (Timer.measure_many) the index of the call each sample timed."""
    who = None


class VoidBatch(Batch):
    """Samples timed under another load than the policy asks for (queue back_to_back: the GPU caught up with the
    host, so a launch's latency may be inside them): they count towards busy_fraction and are not kept."""


def sample_loop(batch, rule: StoppingRule, clock=None, max_mhz: int = 0, throttle_fraction: float = 0.75) -> dict:
    """The harness's timed loop (stopping.cpp, sample_loop) without the GPU: `batch()` gives the next samples in us
    (a list: peers time several back to back, see Timer; a VoidBatch is not kept), `clock()` the SM clock in MHz
    (0: unknown), read once per batch. Samples taken under throttle_fraction of max_mhz are dropped; they still
    count towards busy_fraction, the GPU time inside samples over the loop's wall time."""
    return sample_loop_many(batch, [rule], clock, max_mhz, throttle_fraction)[0]


def sample_loop_many(batch, rules: list, clock=None, max_mhz: int = 0, throttle_fraction: float = 0.75) -> list:
    """sample_loop for several calls timed in one loop (Timer.measure_many): a batch's samples carry in `.who` the
    index of the call each timed (untagged: all the first's), each call has its own stopping rule, and the loop runs
    until every rule has stopped; a call whose rule stopped keeps its turn in the batches, so that the load stays
    the same for the others, but its samples are no longer kept. Busy fraction, void batches and the wall time are
    the loop's, the same in every call's statistics."""
    n = len(rules)
    dropped, clocks, busy_us, void_batches, done = [0] * n, [[] for _ in rules], 0.0, 0, [False] * n
    timed_out = lambda wall: all(d or (r.timed_out(wall) and len(r.samples) >= 3) for d, r in zip(done, rules))
    t0 = time.perf_counter()
    while not all(done):
        got = batch()
        who = getattr(got, "who", None) or [0] * len(got)
        busy_us += sum(got)
        wall = time.perf_counter() - t0
        if isinstance(got, VoidBatch):
            void_batches += 1
            if timed_out(wall):
                break
            if rules[0].timed_out(wall * 0.5) and not any(r.samples for r in rules) and void_batches >= 8:
                raise RuntimeError("every batch of samples was void (the host could not keep the GPU's queue)")
            continue
        mhz = clock() if clock else 0
        wall = time.perf_counter() - t0
        if mhz > 0 and max_mhz > 0 and mhz < throttle_fraction * max_mhz:
            for w in who:
                dropped[w] += 1
            if timed_out(wall):
                break
            if rules[0].timed_out(wall * 0.5) and not any(r.samples for r in rules):
                raise RuntimeError("every sample was throttled below {}% of the maximum SM clock".format(
                    int(throttle_fraction * 100)))
            continue
        for us, w in zip(got, who):
            if done[w]:
                continue
            if mhz > 0:
                clocks[w].append(mhz)
            done[w] = rules[w].add(us, wall)
    wall = time.perf_counter() - t0
    out = []
    for w, rule in enumerate(rules):
        st = summarize(rule.samples) if rule.samples else {"median_us": None, "min_us": None, "max_us": None,
                                                           "mean_us": None, "cv": None}
        c = sorted(clocks[w])
        st.update({"samples_us": rule.samples, "dropped_throttled": dropped[w], "stop_reason": rule.reason or "timeout",
                   "noisy": bool(st["cv"] is None or st["cv"] > rule.max_noise), "wall_s": wall,
                   "busy_fraction": busy_us * 1e-6 / wall if wall > 0 else 0.0, "void_batches": void_batches,
                   "sm_clock_mhz": c[len(c) // 2] if c else None})
        out.append(st)
    return out


def hold_us(enqueue_us: float, period_us: float, k: int, margin: float) -> float:
    """How long the GPU must be held for the host to queue k samples before the GPU reaches the first: the host
    needs enqueue_us per sample, the GPU period_us (flush + call). The host must be one sample ahead at the start
    and loses (enqueue_us - period_us) per later sample when it is the slower of the two."""
    return margin * (enqueue_us + (k - 1) * max(0.0, enqueue_us - period_us)) + 20.0


class Nvml:
    """The few NVML reads the harness makes (harness/src/clock.cpp), through pynvml when it is installed; every read
    gives 0 / -1 (unknown) without it."""

    def __init__(self, pci_bus_id, index: int):
        self.nv, self.h = None, None
        try:
            import pynvml
            pynvml.nvmlInit()
            try:
                self.h = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id) if pci_bus_id else None
            except Exception:
                self.h = None
            if self.h is None:
                self.h = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.nv = pynvml
        except Exception:
            self.nv, self.h = None, None

    def _read(self, f, *args, default=0):
        if self.nv is None:
            return default
        try:
            return f(self.h, *args)
        except Exception:
            return default

    def sm_clock_mhz(self) -> int:
        return self._read(self.nv.nvmlDeviceGetClockInfo, self.nv.NVML_CLOCK_SM) if self.nv else 0

    def slowdown_reasons(self) -> int:
        # power cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, power brake 0x80 (as clock.cpp)
        return self._read(self.nv.nvmlDeviceGetCurrentClocksThrottleReasons) & 0xEC if self.nv else 0

    def energy_mj(self) -> int:
        return self._read(self.nv.nvmlDeviceGetTotalEnergyConsumption, default=-1) if self.nv else -1


class Timer:
    """The harness's method (harness/include/flashbench/timing.hpp) in torch terms, with the same policy fields
    (taken from the plan unless given on the command line) and the same stopping rule.

    flush "read" (default) sums a buffer of twice the L2 size that nothing writes, leaving the L2 full of clean
    lines; "write" zeroes it (triton's do_bench, nvbench), leaving dirty lines whose write-back the timed call
    pays for.

    Samples go in batches: a spin (torch.cuda._sleep) holds the GPU while the host queues k x (flush, event, call,
    event), so the host's launch latency (python, SDPA dispatch) never lands between a pair of events, as the
    harness's stream hold keeps it out of ours. An event after the spin proves it: if the GPU had already passed
    the spin when the host finished queuing, the batch is void and the next spin is longer. One sample per host
    round trip instead would leave the GPU idle for the round trip (a few hundred microseconds of python), which at
    short calls kept the GPU at a third of the harness's load, cooler and at a higher clock. Each record carries
    busy_fraction and power_w, as the harness's do.

    queue "back_to_back" (timing.hpp; timer.cu's BackToBack is the same): each batch is queued behind the one the
    GPU runs, before the host waits for that one, so the GPU idles only for the flushes. Only the first batch (and
    the first after the host fell behind) waits behind a spin. A batch queued behind is void if the batch ahead had
    already finished when the host was done queuing it; after two such in a row every batch gets its own spin."""

    MAX_BATCH = 64

    def __init__(self, torch, args, l2_bytes: int, nvml: Nvml = None, max_mhz: int = 0):
        self.torch, self.args = torch, args
        self.flush_buf = torch.ones(max(2 * l2_bytes, 1 << 24), dtype=torch.uint8, device="cuda")
        self.flush_how = getattr(args, "flush", "read")
        self.flush_float = self.flush_buf.view(torch.float32)
        self.sleep = getattr(torch.cuda, "_sleep", None)
        self.nvml = nvml or Nvml(None, torch.cuda.current_device())
        self.max_mhz = max_mhz
        ev = lambda: torch.cuda.Event(enable_timing=True)
        # two sets of (starts, ends): the batch the GPU runs and the batch queued behind it (back_to_back)
        self.sets = [([ev() for _ in range(self.MAX_BATCH)], [ev() for _ in range(self.MAX_BATCH)]) for _ in range(2)]
        self.starts, self.ends = self.sets[0]
        self.held = torch.cuda.Event()
        self.void_batches = 0

    def flush(self):
        if self.flush_how == "write":
            self.flush_buf.zero_()
        else:
            # Read as float32 (bytes 0x01: small normal numbers), torch's fastest reduction. Summing the bytes into
            # int32 took far longer than the harness's flush kernel (between_samples_us in the record shows the cost).
            self.flush_float.sum()

    def settle(self, limit_s: float) -> float:
        """Waits (up to limit_s) until NVML reports no power or thermal slowdown, as the harness does before each
        point (timing.settle_s), so that a peer does not inherit the power cap of the previous point."""
        t0 = time.perf_counter()
        while self.nvml.slowdown_reasons() and time.perf_counter() - t0 < limit_s:
            time.sleep(0.02)
        return time.perf_counter() - t0

    def measure(self, fn) -> dict:
        return self.measure_many([fn])[0]

    def measure_many(self, fns: list) -> list:
        """Times several calls in one loop, sample by sample in turn (A B A B ...: `--interleave sample`), so that
        every call is timed in the same power and thermal phases as the others, within a sample of them. One
        statistics dict per call, each from its own stopping rule; the loop's load (busy fraction, power) is shared.
        """
        torch, a = self.torch, self.args
        n_fns = len(fns)
        settle_wait = self.settle(a.settle) if a.settle > 0 else 0.0
        slowdown = self.nvml.slowdown_reasons()
        self.void_batches = 0
        t_host = time.perf_counter()
        self.starts[0].record()
        for _ in range(a.warmup):
            for fn in fns:
                if a.cold:
                    self.flush()
                fn()
        self.ends[0].record()
        self.ends[0].synchronize()
        n_warm = max(a.warmup, 1) * n_fns
        state = {"period": self.starts[0].elapsed_time(self.ends[0]) * 1e3 / n_warm,  # us, GPU, per sample
                 "enqueue": (time.perf_counter() - t_host) * 1e6 / n_warm, "margin": 1.5, "floor": 0.0}

        # who[s]: which call each sample of event set s timed; turn: the call the next queued sample times
        # k_cap: the largest batch the host has managed to queue in time (halved on each void batch)
        q = {"set": 0, "ahead": False, "ahead_void": False, "behind_voids": 0, "k": [1, 1], "who": [[], []], "turn": 0,
             "k_cap": self.MAX_BATCH}

        def batch_size() -> int:
            return max(1, min(self.MAX_BATCH, int(0.01e6 / max(state["period"], 1.0))))  # ~10 ms of GPU work

        def enqueue(s: int, k: int, hold: bool) -> bool:
            """Queues k samples into event set s, behind a spin if `hold`; False if the GPU was already past it."""
            us = 0.0
            if hold and self.sleep is not None:
                us = min(max(hold_us(state["enqueue"], max(state["period"], 1.0), k, state["margin"]),
                             state["floor"]), 200e3)
                self.sleep(int(us * 1e-6 * 2.0e9))  # cycles; a lower clock only makes the hold longer
                self.held.record()
            starts, ends = self.sets[s]
            t1 = time.perf_counter()
            q["who"][s] = []
            for i in range(k):
                if a.cold:
                    self.flush()
                q["who"][s].append(q["turn"])
                starts[i].record()
                fns[q["turn"]]()
                ends[i].record()
                q["turn"] = (q["turn"] + 1) % n_fns
            state["enqueue"] = (time.perf_counter() - t1) * 1e6 / k
            q["k"][s] = k
            if hold and self.sleep is not None and self.held.query():
                state["margin"] *= 2  # the GPU got ahead of the host: launch latency may be inside the samples
                state["floor"] = 2 * us
                return False
            return True

        def read(s: int, valid: bool) -> list:
            """Waits for the batch in event set s: its samples in us (and, if valid, its period and flush gap)."""
            starts, ends = self.sets[s]
            n = q["k"][s]
            ends[n - 1].synchronize()
            if valid:
                state["period"] = starts[0].elapsed_time(ends[n - 1]) * 1e3 / n
                state["gap"] = ends[0].elapsed_time(starts[1]) * 1e3 if n > 1 else 0.0
            got = Batch(starts[i].elapsed_time(ends[i]) * 1e3 for i in range(n))  # ms -> us
            got.who = q["who"][s][:n]
            return got

        def batch():  # round_trip: one batch per host round trip
            # A void batch holds the GPU longer next time and also halves the batch: a longer hold alone cannot help
            # when the launch queue fills before the batch is in (the host then blocks until the GPU passes the
            # hold), which short samples with several launches each (a flush, a graph, two events) can do.
            k = min(batch_size(), q["k_cap"])
            for _ in range(8):
                in_time = enqueue(0, k, True)
                got = read(0, in_time)
                if in_time:
                    return got
                self.void_batches += 1
                q["k_cap"] = k = max(1, k // 2)
            raise RuntimeError("the host could not queue a batch of samples ahead of the GPU")

        def back_to_back():
            s = q["set"]
            if not q["ahead"]:
                q["ahead"], q["ahead_void"] = True, not enqueue(s, batch_size(), True)
            pipelined = q["behind_voids"] < 2
            if pipelined:
                enqueue(1 - s, batch_size(), False)
            behind_void = pipelined and self.sets[s][1][q["k"][s] - 1].query()
            is_void = q["ahead_void"]
            got = read(s, not is_void)
            if behind_void:
                q["behind_voids"] += 1
            elif pipelined:
                q["behind_voids"] = 0  # once the host fell behind twice in a row, a spin before every batch
            if pipelined:
                q["set"], q["ahead_void"] = 1 - s, behind_void
            else:
                q["ahead"] = False
            if is_void:
                self.void_batches += 1
                return VoidBatch(got)
            return got

        rules = [StoppingRule(a.min_samples, a.max_noise, a.min_time, a.timeout, a.max_samples) for _ in fns]
        e0 = self.nvml.energy_mj()
        queued = getattr(a, "queue", "round_trip") == "back_to_back"
        stats = sample_loop_many(back_to_back if queued else batch, rules, self.nvml.sm_clock_mhz, self.max_mhz,
                                 a.throttle_fraction)
        e1 = self.nvml.energy_mj() if e0 >= 0 else -1
        torch.cuda.synchronize()  # the batch still queued behind the last one read
        for st in stats:
            st["power_w"] = power_w(e0, e1, st["wall_s"])
            st["settle_wait_s"] = settle_wait
            st["slowdown_at_start"] = slowdown
            # round_trip: retried inside batch(); back_to_back: as sample_loop counted
            st["void_batches"] = self.void_batches
            st["host_enqueue_us"] = state["enqueue"]  # host time to queue one sample, last batch
            st["between_samples_us"] = state.get("gap")  # GPU time from one sample's end to the next's start
        return stats


def power_w(e0_mj: float, e1_mj: float, wall_s: float) -> float:
    """Mean power from two reads of NVML's energy counter; 0 (unknown) for loops under 0.5 s, where the counter's
    update interval (tens of ms on an H200: loops of 60 ms read 0 to 1000 W) swamps the mean."""
    if e0_mj < 0 or e1_mj < e0_mj or wall_s < 0.5:
        return 0.0
    return (e1_mj - e0_mj) * 1e-3 / wall_s
