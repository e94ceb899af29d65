"""Rerolled loops under the default backend (llvm, dynamic=None): the first
EXACT_LENGTHS lengths compile for their exact trip count with llvm (fast); a further
length makes the trip count symbolic, compiled once by llvm for every length from the
three traces (compiler.lowering.llvm_sym; numba where they make no such kernel), which
replaces the exact specializations (its guard accepts their lengths too).

Oracles: eager hybridnet (losses, parameter gradients) after every call.
"""

import numpy as np
import pytest
from trace_helpers import same_loss_and_grads

import hybridnet as hn
import hybridnet.nn as nn
import hybridnet.nn.functional as F
from hybridnet.jit.traced import EXACT_LENGTHS


def _backends(entry):
    res = entry.traces[0].result
    return res.backend, None if res.backward is None else res.backward.backend


def _over(cell, xs):
    h = hn.zeros(3, 5)
    for t in range(xs.shape[0]):
        h = cell(xs[t], h)
    return h


@pytest.mark.parametrize("cls", [nn.RNNCell, nn.GRUCell])
def test_two_lengths_compile_exactly_then_one_generic_kernel_serves_the_rest(cls):
    assert EXACT_LENGTHS == 2
    hn.manual_seed(3)
    cell = cls(4, 5)
    traced = hn.trace(lambda xs, target: F.mse_loss(_over(cell, xs), target))
    assert traced.backend == "llvm"
    rng = np.random.default_rng(3)

    def call(steps):
        xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
        target = hn.tensor(rng.standard_normal((3, 5)).astype(np.float32))
        same_loss_and_grads(traced, cell, xs, target)

    for steps in (9, 9, 13, 13):
        call(steps)
    assert not any(e["kind"] == "generalize" for e in traced.stats.events)
    assert all(_backends(e) == ("llvm", "llvm") for e in traced.specializations.values())
    call(20)  # (a third length: symbolic)
    assert any(e["kind"] == "generalize" for e in traced.stats.events), traced.stats.events
    generic = [e for e in traced.specializations.values() if e.symbolic]
    assert len(generic) == 1 and _backends(generic[0]) == ("llvm", "llvm")
    result = generic[0].traces[0].result
    assert result.fallback is None and result.kernel.program.sym is not None
    assert result.backward.kernel.program.sym is not None
    kinds = [e["kind"] for e in traced.stats.events]
    assert "backend_fallback" not in kinds, kinds
    assert len(traced.specializations) == 1  # (the exact ones were replaced)
    traces = traced.stats.traces
    for steps in (31, 20, 9, 13, 50, 13):  # (no new trace: the generic kernel)
        call(steps)
    stats = traced.stats  # (31 and 50: probes, traced once to confirm: dynamic.Hull)
    assert stats.traces - stats.probes == traces and stats.probes == 2, stats
    assert len(traced.specializations) == 1


def test_a_cache_of_two_still_generalizes():
    hn.manual_seed(5)
    cell = nn.GRUCell(4, 5)
    traced = hn.trace(lambda xs: _over(cell, xs), cache_limit=2)
    rng = np.random.default_rng(5)
    with hn.no_grad():
        # (numba generalizes from 9 and 13; 20, 31, 40, 50 and 7, 8 are probes)
        for steps in (9, 13, 9, 20, 31, 13, 40, 7, 8, 50, 11, 60, 70, 12, 10):
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            np.testing.assert_allclose(traced(xs).numpy(), _over(cell, xs).numpy(),
                                       rtol=1e-5, atol=1e-6)
    assert any(e["kind"] == "generalize" for e in traced.stats.events), traced.stats.events
    assert traced.stats.probes <= 6 and traced.stats.compiled_calls >= 8, traced.stats


def test_a_fixed_length_training_step_never_waits_for_numba():
    hn.manual_seed(4)
    cell = nn.LSTMCell(4, 6)
    head = nn.Linear(6, 2)
    params = list(cell.parameters()) + list(head.parameters())
    opt = hn.optim.SGD(params, lr=0.1)

    def step(xs, y):
        opt.zero_grad()
        h = c = hn.zeros(3, 6)
        for t in range(xs.shape[0]):
            h, c = cell(xs[t], (h, c))
        loss = F.cross_entropy(head(h), y)
        loss.backward()
        opt.step()
        return loss.detach()

    traced = hn.trace(step)
    rng = np.random.default_rng(4)
    xs = hn.tensor(rng.standard_normal((35, 3, 4)).astype(np.float32))
    y = hn.tensor(rng.integers(0, 2, 3))
    for _ in range(5):  # (the first two run eagerly: the second finds .grad set)
        traced(xs, y)
    entry = list(traced.specializations.values())[-1]
    result = entry.traces[0].result
    assert result.backend == "llvm" and result.fallback is None
    assert any(n.op == "loop" for n in result.optimized.nodes)
    assert traced.stats.compiled_calls >= 3


def test_lengths_beyond_the_traced_ones_are_probed_then_trusted():
    """A length outside those the kernels for every length were made from is traced once
    and compared (dynamic.Hull); after four confirmed on one side, the lengths beyond run
    compiled unprobed. A cap Python computed, xs[:min(n, 12)], is confirmed at 12 and
    refuted at the first probe past it, 13: from there on those lengths run eagerly."""
    from hybridnet.jit.dynamic import TRUST
    hn.manual_seed(4)
    cell = nn.RNNCell(4, 5)
    traced = hn.trace(lambda xs: _over(cell, xs))
    capped = hn.trace(lambda xs: _over(cell, xs[:min(xs.shape[0], 12)]))
    rng = np.random.default_rng(4)
    with hn.no_grad():
        for steps in (9, 10, 11) + tuple(range(12, 22)) + (40, 10, 13, 30):
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            for fn in (traced, capped):
                np.testing.assert_allclose(fn(xs).numpy(), fn.fn(xs).numpy(), rtol=1e-5,
                                           atol=1e-6, err_msg=f"{steps} steps")
    stats = traced.stats
    assert stats.probes == TRUST, stats.events  # (12, 13, 14 and 15)
    assert stats.compiled_calls == 10, stats  # (16..21, 40, 30 unprobed; 10, 13 inside)
    assert "confirmed for 9..15" in str(hn.explain(traced))
    kinds = [e["kind"] for e in capped.stats.events]
    assert "generalize" in kinds and kinds.count("probe") == 2, capped.stats.events
    assert "side_exit" in kinds  # (14.. and 40, 30: beyond the refuted 13)
    assert "13 and above run eagerly" in str(hn.explain(capped))
