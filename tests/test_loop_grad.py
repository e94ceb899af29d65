"""Gradients of rerolled loops (compiler.loop_grad): the forward is rerolled first and
each loop node differentiated by its own rule, a reversed loop.

Oracles: the unrolled trace differentiated op by op (`autodiff.grad_graph`), both run by
the reference interpreter; eager hybridnet through hn.trace; and the structure (one
backward loop, no step left unrolled) that makes it cheap to compile.
"""

import numpy as np
import pytest
from trace_helpers import recorded as _recorded
from trace_helpers import same_loss_and_grads
from trace_helpers import source_arrays as _arrays

import hybridnet as hn
import hybridnet.nn as nn
import hybridnet.nn.functional as F
from compiler.autodiff import grad_graph
from compiler.gradient import split_gradient
from compiler.loop import SeqIn, is_loop
from compiler.loop_grad import _mirrored, loop_joint

CELLS = {"rnn": nn.RNNCell, "lstm": nn.LSTMCell, "gru": nn.GRUCell}


def _run_cell(cell, x, state):
    if isinstance(cell, nn.LSTMCell):
        h, c = cell(x, state)
        return (h, c), h
    h = cell(x, state[0])
    return (h,), h


def _rnn(cell, xs, collect=False, hidden=5):
    state = (hn.zeros(3, hidden),) * (2 if isinstance(cell, nn.LSTMCell) else 1)
    hs = []
    for t in range(xs.shape[0]):
        state, h = _run_cell(cell, xs[t], state)
        hs.append(h)
    return hn.stack(hs) if collect else state[0]


def _same_as_unrolled(fn, args, loops_at_least=1):
    """loop_joint's graph computes what the unrolled graph's gradient graph does."""
    tg = _recorded(fn, *args)
    wrt = [tg.graph.inputs[i] for i in tg.grad_inputs]
    joint = loop_joint(tg.graph, wrt, tg.grad_results, tg.blocked)
    assert joint is not None, "the loop's gradient should be a loop"
    joint.verify()
    assert sum(is_loop(n) for n in joint.nodes) >= 2 * loops_at_least
    reference = grad_graph(tg.graph, wrt, tg.grad_results, tg.blocked)
    rng = np.random.default_rng(1)
    seeds = [rng.standard_normal(tg.graph.outputs[k].shape).astype(np.float32)
             for k in tg.grad_results]
    arrays = _arrays(tg, list(args)) + seeds
    got, want = joint.run(*arrays), reference.run(*arrays)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5)
    return joint


@pytest.mark.parametrize("kind", sorted(CELLS))
@pytest.mark.parametrize("steps", [3, 11])
def test_a_cells_loss_gradient_equals_the_unrolled_one(kind, steps):
    hn.manual_seed(0)
    cell = CELLS[kind](4, 5)
    target = hn.randn(3, 5)
    _same_as_unrolled(lambda x, y: F.mse_loss(_rnn(cell, x), y),
                      (hn.randn(steps, 3, 4), target))


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_gradients_of_the_sequence_and_of_every_collected_step(kind):
    hn.manual_seed(0)
    cell = CELLS[kind](4, 5)
    xs = hn.randn(7, 3, 4, requires_grad=True)
    _same_as_unrolled(lambda x: (_rnn(cell, x, collect=True) ** 2).sum(), (xs,))


def test_a_sequence_read_after_its_first_steps_gets_zeros_there():
    hn.manual_seed(0)
    cell = nn.RNNCell(4, 5)
    xs = hn.randn(9, 3, 4, requires_grad=True)

    def f(x):
        h = hn.zeros(3, 5)
        for t in range(2, x.shape[0]):
            h = cell(x[t], h)
        return h.sum()
    joint = _same_as_unrolled(f, (xs,))
    assert any(n.op == "pad_slice" for n in joint.nodes)


def test_a_sequence_read_from_its_end():
    hn.manual_seed(0)
    cell = nn.RNNCell(4, 5)
    xs = hn.randn(8, 3, 4, requires_grad=True)

    def f(x):
        h = hn.zeros(3, 5)
        for t in reversed(range(x.shape[0])):
            h = cell(x[t], h)
        return (h * h).mean()
    _same_as_unrolled(f, (xs,))


def test_two_stacked_layers_each_get_a_backward_loop():
    hn.manual_seed(0)
    lower, upper = nn.RNNCell(4, 5), nn.RNNCell(5, 5)
    xs = hn.randn(10, 3, 4, requires_grad=True)
    _same_as_unrolled(lambda x: _rnn(upper, _rnn(lower, x, collect=True), collect=True)
                      .tanh().sum(), (xs,), loops_at_least=2)


def test_a_carried_scalar_and_a_value_made_under_no_grad():
    hn.manual_seed(0)
    w = hn.randn(5, 5, requires_grad=True)
    xs = hn.randn(9, 5, requires_grad=True)

    def f(x):
        h, total = hn.zeros(5), hn.zeros(())
        for t in range(x.shape[0]):
            h = hn.tanh(w @ h + x[t])
            with hn.no_grad():
                scale = h.abs().max()
            total = total + (h * scale).sum() * 0.5
        return total
    _same_as_unrolled(f, (xs,))


def test_the_backward_of_a_traced_rnn_loss_is_one_reversed_loop():
    """The W4 shape: after rerolling the forward first, the backward is one loop and
    the weights' gradients are products over every step outside it."""
    hn.manual_seed(0)
    cell = nn.RNNCell(4, 5)
    tg = _recorded(lambda x, y: F.mse_loss(_rnn(cell, x), y), hn.randn(30, 3, 4),
                   hn.randn(3, 5))
    wrt = [tg.graph.inputs[i] for i in tg.grad_inputs]
    split, _ = split_gradient(tg.graph, wrt, tg.grad_results, tg.blocked)
    loops = [n for n in split.backward.nodes if is_loop(n)]
    assert len(loops) == 1
    seqs = loops[0].attrs["spec"].seqs
    assert seqs and all(s.stride < 0 for s in seqs)
    # (30 steps: nothing of them is left unrolled outside the loops)
    assert len(split.backward.nodes) < 60 and len(split.forward.nodes) < 40


def test_mirrored_sequences_read_the_same_slices_backwards():
    for seq in (SeqIn(0, 1, 1, 0, 0), SeqIn(0, 2, 2, 1, 3), SeqIn(1, 3, -3, 3, 0),
                SeqIn(0, 1, -1, 4, 2)):
        n = 40 + seq.width  # (a size that fits whole steps)
        while True:
            try:
                trip = seq.trip(n)
                break
            except Exception:  # noqa: BLE001
                n += 1
        back = _mirrored(seq)
        assert back.trip(n) == trip
        assert [back.start(n, k) for k in range(trip)] == \
            [seq.start(n, trip - 1 - k) for k in range(trip)]


@pytest.mark.parametrize("backend", ["llvm", "numba"])
def test_traced_training_over_lengths_equals_eager(backend):
    hn.manual_seed(0)
    cell = nn.LSTMCell(4, 5)

    def loss_of(xs, target):
        return F.mse_loss(_rnn(cell, xs), target)
    traced = hn.trace(loss_of, backend=backend)
    rng = np.random.default_rng(0)
    for steps in [9, 12, 15, 20, 6, 31, 3]:
        xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
        target = hn.tensor(rng.standard_normal((3, 5)).astype(np.float32))
        same_loss_and_grads(traced, cell, xs, target)
    assert traced.stats.compiles <= 1, traced.stats


def test_picked_steps_get_their_gradient_at_their_block():
    hn.manual_seed(0)
    cell = nn.GRUCell(4, 5)
    xs = hn.randn(12, 3, 4, requires_grad=True)

    def f(x):
        h, hs = hn.zeros(3, 5), []
        for t in range(x.shape[0]):
            h = cell(x[t], h)
            hs.append(h)
        return (hn.stack(hs).sum() + (hs[3] * hs[-2]).sum() + hs[0].mean())
    _same_as_unrolled(f, (xs,))


@pytest.mark.parametrize("mode", ["strict", "0"])
def test_the_pass_report_says_whether_the_loops_gradient_is_a_loop(monkeypatch, mode):
    monkeypatch.setenv("HYBRIDNET_LOOP_GRAD", mode)
    hn.manual_seed(0)
    cell = nn.RNNCell(4, 5)
    tg = _recorded(lambda x, y: F.mse_loss(_rnn(cell, x), y), hn.randn(12, 3, 4),
                   hn.randn(3, 5))
    wrt = [tg.graph.inputs[i] for i in tg.grad_inputs]
    split, report = split_gradient(tg.graph, wrt, tg.grad_results, tg.blocked)
    entry, = [p for p in report if p["name"] == "loop_grad"]
    assert entry["changed"] == (mode == "strict")
    assert (entry["note"] is None) == (mode == "strict"), entry
    assert entry["nodes_after"] < entry["nodes_before"] if mode == "strict" else \
        entry["nodes_after"] > entry["nodes_before"]


def test_two_overlapping_runs_with_gradients_compile_once():
    """stack(hs[1:]) - stack(hs[:-1]): each step's gradient adds two slices, which the
    rerolled joint graph left unrolled per length; the loop's own gradient takes it."""
    hn.manual_seed(0)
    cell = nn.GRUCell(4, 5)

    def f(xs):
        h, hs = hn.zeros(3, 5), []
        for t in range(xs.shape[0]):
            h = cell(xs[t], h)
            hs.append(h)
        return ((hn.stack(hs[1:]) - hn.stack(hs[:-1])) ** 2).sum()
    traced = hn.trace(f)
    rng = np.random.default_rng(3)
    for steps in (9, 13, 20, 31, 17, 11, 40, 25, 15, 33):  # (31, 40: probes)
        xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
        same_loss_and_grads(traced, cell, xs)
    assert len(traced.specializations) == 1 and traced.stats.compiles == 1, traced.stats
    assert traced.stats.compiled_calls >= 5, traced.stats
