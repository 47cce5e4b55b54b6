"""One problem's peers, built, verified and timed: prepare_peer (build, run once, check against float64, capture in
a CUDA graph), time_peer (one record) and run_problem (every peer of a problem, `rounds` times in turn, or sample
by sample with interleave "sample").
"""
from __future__ import annotations

import warnings

from .backends import Peer, first_line, make_inputs, reference_check
from .backward import grad_check, grads_close, is_bwd
from .records import record


def _bitwise_equal(torch, a, b) -> bool:
    """Bit for bit (one-byte floats, e4m3 O, compared as their bytes, which every torch compares)."""
    if a.element_size() == 1 and a.is_floating_point():
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return bool(torch.equal(a, b))


def _clone(out):
    return tuple(x.clone() for x in out) if isinstance(out, (tuple, list)) else out.clone()


def prepare_peer(torch, pe: Peer, inputs, seed: int, verify: bool, graph: bool = True):
    """Builds, runs once and verifies one peer on a problem's inputs. Returns (record, None) where it is not to be
    timed (skipped, incorrect, crashed), else (None, (fn to time, check, how it is launched))."""
    p, name = pe.p, pe.name
    rec = lambda status, why, check=None: record(name, p, status, why, check=check, seed=seed, extra=pe.extra,
                                                 config_str=pe.config or "")
    why = pe.skip_reason()
    if why:
        return rec("skipped", why), None
    if inputs is None:
        return rec("skipped", "inputs do not fit in device memory"), None
    q, k, v = inputs
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pe.inputs = inputs  # e4m3: build() reads the descales (Fp8Inputs)
            fn = pe.build(q, k, v)
            out = fn()
            torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return rec("skipped", "out of device memory"), None
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
        # SDPA raises RuntimeError "No available kernel" and gives its reasons as warnings: keep the telling one
        why = [str(w.message).split(" (Triggered internally")[0] for w in caught]
        why = [w for w in why if not w.rstrip().endswith("because:") and "runtime disabled" not in w]
        return rec("skipped", "{} cannot run this problem: {}".format(
            name, why[0][:300] if why else first_line(e))), None
    except Exception as e:  # torch.compile/inductor failures surface as their own exception types
        return rec("crashed", first_line(e)), None
    check, accept = {}, None
    if is_bwd(p):
        # dQ accumulates by atomics in most backwards: a replay is accepted if it passes the same check (or, unverified,
        # agrees with the eager call within the tolerance), not bit for bit
        if verify:
            # against the gradients of the O the peer's backward read (its D = rowsum(dO * O)): bwd_o, or the
            # reference forward's
            try:
                ref = inputs.reference(getattr(pe, "bwd_o", None))
                check = grad_check(torch, p, ref, out)
            except ValueError as e:
                return rec("incorrect", first_line(e)), None
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                return rec("skipped", "the reference gradients do not fit in device memory"), None
            accept = lambda o: grad_check(torch, p, ref, o)["_bad"] == 0
        else:
            first = _clone(out)
            accept = lambda o: grads_close(torch, p, o, first)
    elif verify:
        # e4m3: the reference of the values the peer computes on (its own descales, or the per-block ones)
        rq, rk, rv = getattr(pe, "ref_values", None) or getattr(inputs, "values", None) or (q, k, v)
        # an e4m3 O (cudnn_fp8) is checked as its codes times its descale, with its own rounding to e4m3 added
        o_descale = getattr(pe, "o_descale", None)
        got = out if o_descale is None else out.float() * o_descale
        check = reference_check(torch, p, rq, rk, rv, got, o_descale=o_descale)
    bad = check.pop("_bad", 0)
    if bad:
        return rec("incorrect", "{} elements beyond atol+rtol*|ref| (max error {})".format(
            bad, check["max_error"]), check), None
    replay, graph_why = as_graph(torch, fn, _clone(out), pe.poison, accept) if graph else (None, "--eager")
    del out
    return None, (replay or fn, check, "cuda_graph" if replay else "eager ({})".format(graph_why))


def time_peer(torch, timer, pe: Peer, ready, seed: int, rep=(0, 1), timing=None) -> dict:
    """The record of one timing of a prepared peer: timed here, or `timing` as measure_many gave it (an exception
    if that loop failed)."""
    fn, check, launch = ready
    cfg = pe.config or ""
    try:
        if timing is None:
            timing = timer.measure(fn)
        elif isinstance(timing, Exception):
            raise timing
    except Exception as e:
        return record(pe.name, pe.p, "crashed", first_line(e), check=check, seed=seed, extra=pe.extra,
                      config_str=cfg, rep=rep)
    timing["launch"] = launch
    return record(pe.name, pe.p, "ok", "", timing, check, seed, pe.extra, config_str=cfg, rep=rep)


def run_problem(torch, timer, peers: list, p: dict, seed: int, verify: bool, rounds: int, graph: bool = True,
                interleave: str = "round") -> list:
    """Every peer on one problem, on one set of inputs: each built and verified, then timed `rounds` times in turn
    (the order reversed every other round), so that each round's records were timed within moments of each
    other. interleave "sample": in each round all of them in one timed loop, sample by sample in turn
    (Timer.measure_many), so that each sample of one was taken within a sample of the others'."""
    records, ready = [], []
    try:
        inputs = make_inputs(torch, p, seed, "cuda")
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        inputs = None
    for pe in peers:
        rec, r = prepare_peer(torch, pe, inputs, seed, verify, graph)
        if rec:
            records.append(rec)
        else:
            ready.append((pe, r))
    for i in range(rounds):
        order = ready if i % 2 == 0 else ready[::-1]
        if interleave == "sample" and len(order) > 1:
            try:
                stats = timer.measure_many([r[0] for _, r in order])
            except Exception as e:
                stats = [e] * len(order)
            for (pe, r), st in zip(order, stats):
                records.append(time_peer(torch, timer, pe, r, seed, (i, rounds), st))
            continue
        for pe, r in order:
            records.append(time_peer(torch, timer, pe, r, seed, (i, rounds)))
    for pe in peers:
        pe.close()
    return records


def as_graph(torch, fn, eager_out, poison=None, accept=None):
    """The peer's call captured in a CUDA graph, whose replay costs the host ~10 us instead of the ~100s of us of
    python and SDPA dispatch per eager call: the host then keeps ahead of the GPU and the timed loop's load comes
    close to the harness's. The GPU runs the same kernels; the replay's output must equal the verified eager
    output bit for bit (or, given `accept`, pass accept(output): a backward's own check), else the eager call is
    timed. Outputs may be a tensor or a tuple of them. Returns (replay or None, why not)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn()
        if poison:  # fn writes the same buffers every call: the replay must rewrite them
            poison()
        g.replay()
        torch.cuda.synchronize()
        if accept is not None:
            if not accept(out):
                return None, "graph replay output fails the check the eager call passed"
        elif not all(_bitwise_equal(torch, a, b) for a, b in zip(*((out, eager_out) if isinstance(out, (tuple, list))
                                                                  else ((out,), (eager_out,))))):
            return None, "graph replay output differs from the eager call"
        return g.replay, ""
    except Exception as e:
        torch.cuda.synchronize()
        return None, "not capturable: " + first_line(e)[:120]
