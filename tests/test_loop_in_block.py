"""A carried value the loop body also collects (an RNN's hidden state, carried to the next
step and returned for every step) is written once per step, into its block of the
collected output, which the next step reads (compiler/lowering/llvm_loop.py, _in_block).

Oracles: eager hybridnet (outputs, final state, parameter gradients) at every length, for
the exact and the symbolic kernels; a in_block_spy on _in_block says which loops took the path.
"""

import numpy as np
import pytest

import hybridnet as hn
import hybridnet.nn as nn


def _states(cell, xs, how):
    h = hn.zeros(3, 5)
    hs = []
    steps = range(xs.shape[0])
    for t in reversed(steps) if how == "reversed" else steps:
        h = cell(xs[t], h)
        if how == "front":
            hs.insert(0, h)
        else:
            hs.append(h)
    if how == "cat1":
        return hn.cat(hs, dim=1), h
    return hn.stack(hs, dim=1 if how == "dim1" else 0), h


def _check(traced, fn, cell, xs):
    outs = []
    for f in (traced, fn):
        cell.zero_grad()
        seq, last = f(xs)
        ((seq * seq).sum() + (last * 3.0).sum()).backward()
        outs.append((seq.detach().numpy().copy(), last.detach().numpy().copy(),
                     [p.grad.numpy().copy() for p in cell.parameters()]))
    (s1, l1, g1), (s2, l2, g2) = outs
    np.testing.assert_allclose(s1, s2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(l1, l2, rtol=1e-5, atol=1e-6)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("how", ["forward", "reversed", "dim1", "cat1"])
def test_states_collected_and_carried_match_eager_at_every_length(in_block_spy, how):
    hn.manual_seed(7)
    cell = nn.RNNCell(4, 5)

    def fn(xs):
        return _states(cell, xs, how)
    traced = hn.trace(fn)
    rng = np.random.default_rng(7)
    for steps in (9, 13, 20, 31, 9, 50, 6, 15, 25, 40):  # (31, 50, 6: probes)
        xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
        _check(traced, fn, cell, xs)
    assert traced.stats.compiled_calls >= 4, traced.stats
    assert any(e.symbolic for e in traced.specializations.values())
    # (the forward loop's blocks: contiguous, or strided when joined along dim 1, where
    # the state is carried apart; the backward loop carries gradients only, and collects
    # none of them: compiler.loop_grad)
    assert any(in_block_spy) == (how in ("forward", "reversed")), (how, in_block_spy)


def test_final_state_alone_is_carried_apart(in_block_spy):
    hn.manual_seed(8)
    cell = nn.GRUCell(4, 5)

    def fn(xs):
        h = hn.zeros(3, 5)
        for t in range(xs.shape[0]):
            h = cell(xs[t], h)
        return h
    traced = hn.trace(fn)
    rng = np.random.default_rng(8)
    with hn.no_grad():
        for steps in (9, 13, 20, 31, 7, 64, 15, 25, 40):  # (31, 64: probes)
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            np.testing.assert_allclose(traced(xs).numpy(), fn(xs).numpy(),
                                       rtol=1e-5, atol=1e-6)
    assert traced.stats.compiled_calls >= 3, traced.stats
    # (nothing collected: no block to carry in)
    assert in_block_spy and not any(in_block_spy), in_block_spy


def test_a_state_collected_only_every_step_and_read_after_the_loop(in_block_spy):
    """The collected states and the final state both outlive the loop, the final one
    used after the collected output is dead (the final value is a copy of the last
    block, not a view of it)."""
    hn.manual_seed(9)
    cell = nn.RNNCell(4, 5)

    def fn(xs):
        seq, last = _states(cell, xs, "forward")
        return seq * 2.0, last.tanh() * 2.0
    traced = hn.trace(fn)
    rng = np.random.default_rng(9)
    with hn.no_grad():
        for steps in (9, 13, 20, 31, 40, 5, 15, 25, 35):  # (31, 40: probes)
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            for got, want in zip(traced(xs), fn(xs)):
                np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert traced.stats.compiled_calls >= 3, traced.stats
    assert any(in_block_spy), in_block_spy
