"""Products leave rerolled loops (compiler.loop_hoist).

Oracles: the reference interpreter on the graph before the rewrite (the rewritten graph
must compute the same values), eager hybridnet (a traced training step leaves the same
loss and parameters), and counts of the products left in loop bodies (the rewrite must
happen where it should and only there).
"""

import numpy as np
import pytest

import hybridnet as hn
import hybridnet.nn as nn
from compiler import interpret
from compiler.loop import is_loop
from compiler.loop_hoist import hoist_products
from compiler.passes.manager import optimize
from compiler.reroll import reroll


def _graph(fn, *args):
    """fn's trace, rerolled and optimized as compile_trace does, before hoisting."""
    traced = hn.trace(fn, backend="numba")
    while not traced.specializations:  # (a step's first call runs eagerly: state is made)
        traced(*args)
    tg = next(iter(traced.specializations.values())).traces[0].tg
    rng = np.random.default_rng(0)  # (the interpreter is the oracle: any values do)
    arrays = [rng.standard_normal(i.shape).astype(i.dtype) if i.dtype.kind == "f" else
              np.zeros(i.shape, i.dtype) for i in tg.graph.inputs]
    return optimize(reroll(tg.graph)[0])[0], arrays


def _hoisted(graph, arrays, rtol=1e-5):
    """Hoist a copy of `graph`; its values must equal the original's. Returns the copy
    and the number of products moved."""
    new = graph.clone()
    moved = hoist_products(new)
    new.verify()
    want, got = interpret.run(graph, *arrays), interpret.run(new, *arrays)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   rtol=rtol, atol=1e-6)
    return new, moved


def _body_products(graph) -> list:
    """The number of matrix products in each top-level loop's body."""
    return [sum(b.op == "matmul" for b in n.attrs["spec"].body.nodes)
            for n in graph.nodes if is_loop(n)]


def _x(*shape, seed=0):
    return hn.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _lstm_step(layers=1, bidirectional=False, mean=False):
    hn.manual_seed(0)
    rnn = nn.LSTM(3, 4, layers, bidirectional=bidirectional)
    opt = hn.optim.SGD(rnn.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        out, _ = rnn(x)
        loss = (out * out).mean() if mean else (out * out).sum() * 0.01
        loss.backward()
        opt.step()
        return loss
    return rnn, opt, step


def test_an_lstm_training_step_keeps_only_its_recurrent_products_in_its_loops():
    _, _, step = _lstm_step()
    graph, arrays = _graph(step, _x(6, 2, 3))
    before = _body_products(graph)
    new, moved = _hoisted(graph, arrays)
    # forward: the input projection leaves; backward: both weight gradients leave
    assert moved == 3
    assert _body_products(new) == [1, 1] and before == [2, 3]


def test_a_two_layer_lstm_also_sinks_the_input_gradient_and_its_picked_step():
    _, _, step = _lstm_step(layers=2)
    graph, arrays = _graph(step, _x(7, 2, 3))
    new, moved = _hoisted(graph, arrays)
    assert _body_products(new) == [1] * len(_body_products(graph))
    assert moved == sum(_body_products(graph)) - len(_body_products(graph))


def test_a_bidirectional_lstm_hoists_in_both_directions():
    _, _, step = _lstm_step(bidirectional=True)
    graph, arrays = _graph(step, _x(5, 2, 3))
    new, moved = _hoisted(graph, arrays)
    assert moved > 0 and all(n == 1 for n in _body_products(new))


def _cell_loop(kind, over="dim0"):
    hn.manual_seed(1)
    cell = {"rnn": nn.RNNCell, "gru": nn.GRUCell, "lstm": nn.LSTMCell}[kind](3, 4)

    def fn(x):
        h = hn.zeros(2, 4)
        state = (h, h)
        outs = []
        steps = x.shape[0] if over == "dim0" else x.shape[1]
        for t in range(steps):
            xt = x[t] if over == "dim0" else x[:, t]
            if kind == "lstm":
                state = cell(xt, state)
                h = state[0]
            else:
                h = cell(xt, h)
            outs.append(h)
        return hn.stack(outs).sum() + h.sum()
    return fn


@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("over", ["dim0", "dim1"])
def test_cells_over_either_dim_hoist_their_input_projection(kind, over):
    x = _x(6, 2, 3) if over == "dim0" else _x(2, 6, 3)
    graph, arrays = _graph(_cell_loop(kind, over), x)
    new, moved = _hoisted(graph, arrays)
    assert moved >= 1
    assert sum(_body_products(new)) < sum(_body_products(graph))


def test_a_loop_over_part_of_a_sequence_reads_the_hoisted_product_at_its_steps():
    hn.manual_seed(2)
    cell = nn.RNNCell(3, 4)

    def fn(x):
        h = hn.zeros(2, 4)
        for t in range(2, x.shape[0] - 1):  # (a start and an end the loop skips)
            h = cell(x[t], h)
        return h
    graph, arrays = _graph(fn, _x(9, 2, 3))
    _, moved = _hoisted(graph, arrays)
    assert moved == 1


def test_a_product_of_the_carried_state_stays_in_the_loop():
    w = _x(4, 4, seed=3)

    def fn(x):
        h = hn.zeros(2, 4)
        for t in range(x.shape[0]):
            h = (h @ w + x[t]).tanh()
        return h
    graph, arrays = _graph(fn, _x(5, 2, 4))
    new, moved = _hoisted(graph, arrays)
    assert moved == 0 and _body_products(new) == _body_products(graph) == [1]


def test_a_product_along_the_sliced_last_dim_is_not_hoisted():
    w = _x(2, 3, seed=4)

    def fn(x):  # x[..., t]: a column per step; rows of x are not rows of the product
        h = hn.zeros(3, 3)
        for t in range(x.shape[-1]):
            h = (h + x[:, :, t] @ w).tanh()
        return h
    graph, arrays = _graph(fn, _x(3, 2, 5))
    new, moved = _hoisted(graph, arrays)
    assert moved == 0


@pytest.mark.parametrize("read_inside", [False, True])
def test_a_summed_outer_product_leaves_as_one_product_unless_read_inside(read_inside):
    w = _x(3, 3, seed=6)

    def fn(x):
        acc = hn.zeros(3, 3)
        h = hn.zeros(2, 3)
        for t in range(x.shape[0]):
            h = (h @ w + x[t]).tanh()
            acc = acc + h.t() @ x[t]
            if read_inside:
                h = h + acc.sum() * 1e-3  # (the sum is read by the next step)
        return acc, h
    graph, arrays = _graph(fn, _x(6, 2, 3))
    new, moved = _hoisted(graph, arrays)
    assert moved == (0 if read_inside else 1)
    assert _body_products(new) == ([2] if read_inside else [1])


@pytest.mark.parametrize("join", ["stack", "cat", "cat_reversed"])
def test_a_collected_product_of_a_step_value_leaves_the_loop(join):
    w, v = _x(3, 3, seed=7), _x(3, 5, seed=8)

    def fn(x):
        h = hn.zeros(2, 3)
        outs = []
        for t in range(x.shape[0]):
            h = (h @ w + x[t]).tanh()
            outs.append(h @ v)
        if join == "stack":
            return hn.stack(outs)
        return hn.cat(outs[::-1] if join == "cat_reversed" else outs, 0)
    graph, arrays = _graph(fn, _x(6, 2, 3))
    new, moved = _hoisted(graph, arrays)
    assert moved >= 1 and _body_products(new) == [1]


@pytest.mark.parametrize("backend, mean, layers", [
    ("llvm", False, 2), ("llvm", True, 2),
    ("numba", False, 1)])  # (numba: 2 layers give a slice check per length, see below)
def test_a_traced_lstm_step_trains_as_eagerly_over_lengths_with_one_compile(backend, mean,
                                                                           layers):
    """The twin check: parameters after every step, the traced step (products hoisted)
    against an eager twin, over lengths that make the trip count symbolic (with llvm:
    the loss's gradient seed, 0.01 or 1 / count over every output, folds to a broadcast
    scalar, not an array the size of the sequence, which the simplifier then hands to
    the multiplication as a scalar; the mean's count and its reciprocal are computed
    from the length, by llvm only). Numba's size-generic code for a 2-layer LSTM still
    checks a slice of the second layer's input against a size written as a literal, so
    its traces differ by length (each length its own specialization, eager's answers)."""
    rnn_a, _, step_a = _lstm_step(layers=layers, mean=mean)
    rnn_b, _, step_b = _lstm_step(layers=layers, mean=mean)
    traced = hn.trace(step_a, backend=backend)
    for i, n in enumerate([9, 9, 12, 20, 15, 31, 10, 25]):  # (llvm: 31 is a probe)
        x = _x(n, 2, 3, seed=10 + i)
        got, want = traced(x).item(), step_b(x).item()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        for (name, p), q in zip(rnn_a.named_parameters(), rnn_b.parameters()):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-6,
                                       err_msg=name)
    # (llvm: calls 1-4 make the state, then trace three lengths; numba generalizes from
    # two, then probes 20 and 31)
    assert traced.stats.compiled_calls == 3
    assert len(traced.specializations) == 1
    report = next(iter(traced.specializations.values())).traces[0].result.pass_report
    assert any(r["name"] == "loop_hoist" and r["changed"] for r in report)
