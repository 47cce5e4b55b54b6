"""scripts/peers.py's timed loop: the harness's stopping rule and policy, without a GPU."""
import argparse
import os
import random
import sys
import time

import pytest

from conftest import PEERS


def rule(peers, **kw):
    p = dict(min_samples=10, max_noise=0.005, min_time_s=0.5, timeout_s=15.0, max_samples=100000)
    p.update(kw)
    return peers.StoppingRule(**p)


# The three cases of tests/harness/test_stopping.cpp, with the same numbers
def test_quiet_samples_stop_on_noise_after_minimums(peers):
    r, n = rule(peers, min_time_s=0.001), 0
    while not r.add(100.0 + (n % 2) * 0.1, 0.01 * n):
        n += 1
    assert r.reason == "noise" and len(r.samples) >= 10


def test_min_time_is_gpu_time_not_wall_time(peers):
    r, n = rule(peers), 0
    while not r.add(1000.0, 0.001 * n):  # 1 ms samples, and the wall clock is no excuse: needs 500 of them
        n += 1
    assert len(r.samples) == 500


def test_noisy_samples_stop_at_timeout(peers):
    r, rng, wall = rule(peers, timeout_s=1.0), random.Random(1), 0.0
    while not r.add(rng.uniform(50, 150), wall):
        wall += 0.01
    assert r.reason == "timeout" and r.cv() > 0.005


def test_cv_matches_the_two_pass_formula(peers):
    rng = random.Random(7)
    xs = [rng.uniform(90, 110) for _ in range(50)]
    r = rule(peers)
    for x in xs:
        r.add(x, 0.0)
    assert r.cv() == pytest.approx(peers.summarize(xs)["cv"], rel=1e-9)


def test_loop_host_cost_does_not_grow_with_the_sample_count(peers):
    # 100k noisy samples with an unreachable noise target: the loop ends at max_samples. Re-summarising every sample
    # (what peers.py did before) takes minutes here; the harness's running sums take well under a second. The host
    # time per sample is GPU idle time in a real run, so it decides how hot the GPU runs.
    rng = random.Random(3)
    t0 = time.perf_counter()
    st = peers.sample_loop(lambda: [rng.uniform(50, 150) for _ in range(7)],
                           rule(peers, max_samples=100000, max_noise=0.0))
    assert st["stop_reason"] == "max_samples" and len(st["samples_us"]) == 100000
    assert time.perf_counter() - t0 < 5.0


def test_throttled_batches_are_dropped_but_count_as_load(peers):
    mhz = iter([1980, 1000, 1980, 1000] * 10)  # read once per batch of two samples
    st = peers.sample_loop(lambda: [100.0, 100.0], rule(peers, min_samples=5, min_time_s=0.0005), lambda: next(mhz),
                           1980)
    assert len(st["samples_us"]) == 5 and st["dropped_throttled"] == 4  # stops inside the third kept batch
    assert st["sm_clock_mhz"] == 1980 and st["busy_fraction"] > 0


def test_all_throttled_is_an_error_not_a_result(peers):
    with pytest.raises(RuntimeError, match="throttled"):
        peers.sample_loop(lambda: [100.0], rule(peers, timeout_s=0.05), lambda: 900, 1980)


def test_hold_covers_the_queuing_of_a_batch(peers):
    # GPU slower than the host (1 ms calls, 100 us to queue one): a head start of one sample is enough
    assert peers.hold_us(100.0, 1000.0, 10, 1.0) == pytest.approx(120.0)
    # host slower (30 us calls): it falls 70 us further behind with every sample, so the hold covers them all
    assert peers.hold_us(100.0, 30.0, 10, 1.0) == pytest.approx(100.0 + 9 * 70.0 + 20.0)
    assert peers.hold_us(100.0, 30.0, 10, 2.0) == pytest.approx(2 * (100.0 + 9 * 70.0) + 20.0)


def test_power_needs_a_long_enough_loop(peers):
    assert peers.power_w(1_000_000, 1_350_000, 0.5) == pytest.approx(700.0)
    assert peers.power_w(1_000_000, 1_020_000, 0.06) == 0.0  # the counter's steps swamp a 60-ms mean
    assert peers.power_w(-1, -1, 2.0) == 0.0  # no NVML


def test_timing_comes_from_the_plan_unless_given(peers):
    plan = {"min_samples": 7, "max_noise": 0.01, "min_time_s": 0.05, "timeout_s": 1.0, "max_samples": 500,
            "cold": False, "flush": "write", "warmup_runs": 3, "settle_s": 0.5, "throttle_fraction": 0.8,
            "queue": "back_to_back"}
    names = list(peers.TIMING_FIELDS)
    a = argparse.Namespace(**{n: None for n in names})
    a.timeout = 4.0
    peers.resolve_timing(a, plan)
    assert (a.min_samples, a.max_noise, a.min_time, a.max_samples, a.cold, a.flush, a.settle, a.throttle_fraction,
            a.queue) == (7, 0.01, 0.05, 500, False, "write", 0.5, 0.8, "back_to_back")
    assert a.timeout == 4.0  # the command line wins
    assert a.warmup == 10  # torch needs its first calls to pick kernels: never fewer than 10 unless asked
    b = argparse.Namespace(**{n: None for n in names})
    peers.resolve_timing(b, {})
    assert (b.min_samples, b.min_time, b.timeout, b.cold, b.flush, b.queue) == (10, 0.5, 15.0, True, "read",
                                                                               "round_trip")


class FakeTorch:
    """Just enough of torch for peers.Timer: every call is 100 us on the 'GPU', events read a counter, and the
    spin's event reports itself passed for the first `late` batches (a host too slow for its hold)."""

    int32, uint8, float32 = "int32", "uint8", "float32"

    def __init__(self, late=0, queue=None):
        # queue: the most samples the launch queue takes behind a hold; a longer batch makes the host wait for the
        # GPU (the hold passes before the batch is in), however long the hold.
        self.t, self.late, self.sleeps, self.queue, self.recorded = 0.0, late, [], queue, 0
        self.batches = []
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = 0.0

            def record(self):
                self.at = fake.t
                fake.recorded += 1

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return (other.at - self.at) * 1e-3  # ms

            def query(self):
                if fake.late > 0:
                    fake.late -= 1
                    return True
                if fake.queue is not None:
                    # the spin's event: the batch since the last spin had 2 records a sample (start, end)
                    k = fake.recorded // 2
                    fake.batches.append(k)
                    return k > fake.queue
                return False

        class Buf:
            def view(self, dtype):
                return self

            def sum(self, dtype=None):
                fake.t += 30.0

            def zero_(self):
                fake.t += 30.0

        class Cuda:
            @staticmethod
            def _sleep(cycles):
                fake.sleeps.append(cycles)
                fake.recorded = -1  # the hold's own record comes next

            @staticmethod
            def current_device():
                return 0

            @staticmethod
            def synchronize():
                pass

        Cuda.Event = Event
        self.cuda = Cuda
        self.ones = lambda *a, **k: Buf()

    def call(self):
        self.t += 100.0


def fake_args(**kw):
    a = argparse.Namespace(warmup=10, min_samples=10, max_samples=100000, min_time=0.01, timeout=5.0, max_noise=0.01,
                           settle=0.0, cold=True, flush="read", throttle_fraction=0.75)
    vars(a).update(kw)
    return a


class NoNvml:
    sm_clock_mhz = staticmethod(lambda: 0)
    slowdown_reasons = staticmethod(lambda: 0)
    energy_mj = staticmethod(lambda: -1)


def test_timer_batches_samples_behind_one_hold(peers):
    torch = FakeTorch()
    timer = peers.Timer(torch, fake_args(), 1 << 20, NoNvml())
    st = timer.measure(torch.call)
    assert st["median_us"] == pytest.approx(100.0) and st["stop_reason"] == "noise"
    assert len(st["samples_us"]) == 100  # 10 ms of GPU time at 100 us a sample
    assert st["void_batches"] == 0 and len(torch.sleeps) == 2  # batches of 64 (the cap): one hold per batch
    assert st["power_w"] == 0.0


def test_a_batch_the_host_queued_too_late_is_void(peers):
    torch = FakeTorch(late=2)
    timer = peers.Timer(torch, fake_args(), 1 << 20, NoNvml())
    st = timer.measure(torch.call)
    assert st["void_batches"] == 2 and st["median_us"] == pytest.approx(100.0)
    assert torch.sleeps[1] > torch.sleeps[0] and torch.sleeps[2] > torch.sleeps[1]  # each retry holds longer
    never = FakeTorch(late=10 ** 6)
    with pytest.raises(RuntimeError, match="could not queue"):
        peers.Timer(never, fake_args(), 1 << 20, NoNvml()).measure(never.call)


def test_a_batch_longer_than_the_launch_queue_is_halved_until_it_fits(peers):
    # The launch queue takes 20 samples behind a hold: batches of 64 and 32 are void whatever the hold; 16 fit, and
    # every later batch stays at 16.
    torch = FakeTorch(queue=20)
    timer = peers.Timer(torch, fake_args(), 1 << 20, NoNvml())
    st = timer.measure(torch.call)
    assert st["void_batches"] == 2 and st["median_us"] == pytest.approx(100.0)
    assert torch.batches[:3] == [64, 32, 16] and set(torch.batches[3:]) == {16}


def test_back_to_back_queues_each_batch_behind_the_last(peers):
    torch = FakeTorch()
    timer = peers.Timer(torch, fake_args(queue="back_to_back"), 1 << 20, NoNvml())
    st = timer.measure(torch.call)
    assert st["median_us"] == pytest.approx(100.0) and len(st["samples_us"]) == 100
    assert st["void_batches"] == 0 and len(torch.sleeps) == 1  # only the first batch waits behind a spin


def test_back_to_back_batches_the_host_fell_behind_on_are_void(peers):
    # The first batch's spin is passed too early, then twice the batch ahead had finished before the host was done
    # queuing the one behind: three void batches, then a spin before every batch for the rest of the point.
    torch = FakeTorch(late=3)
    timer = peers.Timer(torch, fake_args(queue="back_to_back"), 1 << 20, NoNvml())
    st = timer.measure(torch.call)
    assert st["void_batches"] == 3 and st["median_us"] == pytest.approx(100.0) and len(st["samples_us"]) == 100
    assert len(torch.sleeps) == 3 and torch.sleeps[1] > torch.sleeps[0]  # the first spin's retry holds longer
    assert st["busy_fraction"] > 0


def test_void_batches_are_load_but_not_samples(peers):
    got = iter([peers.VoidBatch([900.0, 900.0]), [100.0, 100.0]] * 10)
    st = peers.sample_loop(lambda: next(got), rule(peers, min_samples=4, min_time_s=0.0))
    assert st["samples_us"] == [100.0] * 4 and st["void_batches"] == 2
    with pytest.raises(RuntimeError, match="void"):
        peers.sample_loop(lambda: peers.VoidBatch([]), rule(peers, timeout_s=0.01))


def test_measure_many_times_the_calls_sample_by_sample_in_turn(peers):
    # A takes 100 us, B 150 us: one loop, samples alternating A B A B, each call its own statistics
    for queue in ("round_trip", "back_to_back"):
        torch = FakeTorch()
        order = []

        def a():
            order.append("a")
            torch.t += 100.0

        def b():
            order.append("b")
            torch.t += 150.0
        timer = peers.Timer(torch, fake_args(queue=queue, min_samples=20), 1 << 20, NoNvml())
        sa, sb = timer.measure_many([a, b])
        assert sa["median_us"] == pytest.approx(100.0) and sb["median_us"] == pytest.approx(150.0), queue
        assert len(sa["samples_us"]) >= 20 and len(sb["samples_us"]) >= 20
        assert all(x != y for x, y in zip(order, order[1:])), queue  # strictly alternating, warm-up included
        assert sa["wall_s"] == sb["wall_s"] and sa["busy_fraction"] == sb["busy_fraction"]


def test_a_call_whose_rule_stopped_keeps_its_turn_but_not_its_samples(peers):
    # side 0 stops at its 3rd sample (max_samples); side 1 needs 6: the loop goes on, side 0's later samples dropped
    got = iter([peers.Batch([1.0, 2.0] * 2) for _ in range(10)])
    batches = []

    def batch():
        b = next(got)
        b.who = [0, 1, 0, 1]
        batches.append(b)
        return b
    r0, r1 = rule(peers, max_samples=3), rule(peers, max_samples=6)
    s0, s1 = peers.sample_loop_many(batch, [r0, r1])
    assert s0["samples_us"] == [1.0] * 3 and s1["samples_us"] == [2.0] * 6
    assert len(batches) == 3 and s0["busy_fraction"] == s1["busy_fraction"]


def test_git_sha_prefers_the_explicit_source_sha(peers, monkeypatch):
    monkeypatch.setenv("FLASHBENCH_SOURCE_SHA", "0123abc")
    assert peers.git_sha() == "0123abc"


def test_git_sha_of_a_snapshot_inside_another_checkout_is_unknown(peers, monkeypatch, tmp_path):
    # A copy of the tree (scripts/peers.py and the package it runs) under an unrelated git repository must not take
    # that repository's HEAD.
    import shutil
    import subprocess
    monkeypatch.delenv("FLASHBENCH_SOURCE_SHA", raising=False)
    outer = tmp_path / "outer"
    snap = outer / "snap"
    (snap / "scripts").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    subprocess.run(["git", "-C", str(outer), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q",
                    "--allow-empty", "-m", "outer"], check=True)
    shutil.copy(PEERS, snap / "scripts" / "peers.py")
    shutil.copytree(os.path.dirname(os.path.dirname(peers.__file__)), snap / "reports" / "flashbench_reports",
                    ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-c", "import runpy, sys; sys.argv = [sys.argv[1]]; "
                          "g = runpy.run_path(sys.argv[0]); from flashbench_reports.peers import records; "
                          "print(records.repo_root()); print(repr(records.git_sha()))",
                          str(snap / "scripts" / "peers.py")], capture_output=True, text=True, check=True)
    root, sha = out.stdout.strip().splitlines()
    assert os.path.realpath(root) == os.path.realpath(snap)  # the snapshot's own package, not this checkout's
    assert sha == "''"


def test_git_sha_marks_a_tree_that_differs_from_head_dirty(peers, monkeypatch, tmp_path):
    # As CMakeLists.txt stamps the harness: HEAD, and HEAD-dirty once a tracked file differs from it.
    import shutil
    import subprocess
    monkeypatch.delenv("FLASHBENCH_SOURCE_SHA", raising=False)
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(PEERS, repo / "scripts" / "peers.py")
    shutil.copytree(os.path.dirname(os.path.dirname(peers.__file__)), repo / "reports" / "flashbench_reports",
                    ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "x"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    run = lambda: subprocess.run([sys.executable, "-c", "import runpy, sys; sys.argv = [sys.argv[1]]; "
                                  "g = runpy.run_path(sys.argv[0]); from flashbench_reports.peers import records; "
                                  "print(records.git_sha())", str(repo / "scripts" / "peers.py")],
                                 capture_output=True, text=True, check=True).stdout.strip()
    assert run() == head
    with open(repo / "scripts" / "peers.py", "a") as f:
        f.write("\n# changed\n")
    assert run() == head + "-dirty"


def test_timing_args_fill_what_is_not_given_from_the_plan_then_the_defaults(peers):
    a = peers.timing_args({"min_samples": 7, "queue": "back_to_back"}, timeout=2.0)
    assert (a.min_samples, a.queue, a.timeout, a.max_noise, a.warmup) == (7, "back_to_back", 2.0, 0.005, 10)
    with pytest.raises(TypeError, match="unknown fields"):
        peers.timing_args(rounds=3)
