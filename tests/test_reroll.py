"""Loop rerolling (compiler.reroll, compiler.loop) and symbolic trip counts (jit.dynamic).

Oracles: the reference interpreter on the unrolled trace (the rerolled graph must compute
the same values), the loop node's own impl run on other lengths, and eager hybridnet
(traced == eager, forward and gradients) over many lengths with one compile.
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
from compiler.ir import Graph
from compiler.loop import Collect, LoopSpec, LoopTripError, SeqIn
from compiler.registry import REGISTRY
from compiler.reroll import has_loops, reroll

CELLS = {"rnn": nn.RNNCell, "lstm": nn.LSTMCell, "gru": nn.GRUCell}


def _cell(kind, i=4, h=5):
    hn.manual_seed(0)
    return CELLS[kind](i, h)


def _step(cell, x, state):
    if isinstance(cell, nn.LSTMCell):
        h, c = cell(x, state)
        return (h, c), h
    h = cell(x, state[0])
    return (h,), h


def _forward(cell, xs, batch=3, hidden=5, collect=False):
    state = (hn.zeros(batch, hidden),) * (2 if isinstance(cell, nn.LSTMCell) else 1)
    outs = []
    for t in range(xs.shape[0]):
        state, h = _step(cell, xs[t], state)
        outs.append(h)
    return hn.stack(outs) if collect else state[0]


def _loops(graph):
    return [n for n in graph.nodes if n.op == "loop"]


def _outside(graph):
    return [n for n in graph.nodes if not n.is_source and n.op not in ("loop", "loop_out")]


# ---- the pass, checked with the interpreter ------------------------------------------------


@pytest.mark.parametrize("kind", sorted(CELLS))
@pytest.mark.parametrize("steps", [3, 8, 21])
def test_a_cell_looped_over_a_time_dim_becomes_one_loop(kind, steps):
    cell = _cell(kind)
    xs = hn.randn(steps, 3, 4)
    with hn.no_grad():
        tg = _recorded(lambda x: _forward(cell, x, collect=True), xs)
    graph, made = reroll(tg.graph)
    graph.verify()
    assert made == 1 and len(_loops(graph)) == 1
    spec = _loops(graph)[0].attrs["spec"]
    assert spec.seqs and spec.seqs[0].dim == 0
    # every step is in the loop: what is left outside is the weights' transposes
    assert all(n.op == "permute" for n in _outside(graph)), [n.op for n in _outside(graph)]
    arrays = _arrays(tg, [xs])
    for a, b in zip(tg.graph.run(*arrays), graph.run(*arrays)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_the_loop_node_runs_lengths_it_was_not_traced_with():
    cell = _cell("gru")
    xs6 = hn.randn(6, 3, 4)
    with hn.no_grad():
        tg = _recorded(lambda x: _forward(cell, x, collect=True), xs6)
    graph, _ = reroll(tg.graph)
    loop = _loops(graph)[0]
    spec = loop.attrs["spec"]
    before = graph.nodes[:graph.nodes.index(loop)]
    inputs = Graph(before, graph.inputs, list(loop.inputs)).run(*_arrays(tg, [xs6]))
    bases = spec.n_carried + spec.n_invariant
    assert [b is graph.inputs[0] for b in loop.inputs[bases:]] == [True]
    for steps in (1, 2, 13):
        xs = hn.randn(steps, 3, 4)
        outs = REGISTRY["loop"].impl(*inputs[:bases], xs.numpy(), spec=spec)
        with hn.no_grad():
            expected = _forward(cell, xs, collect=True).numpy()
        np.testing.assert_allclose(outs[0], expected[-1], rtol=1e-5, atol=1e-6)
        collected = outs[spec.n_carried:spec.n_carried + spec.n_collected]
        assert any(c.size == expected.size and np.allclose(c.reshape(expected.shape), expected,
                                                           rtol=1e-5, atol=1e-6)
                   for c in collected)


def test_cat_of_each_steps_output_along_a_dim_is_the_loops_collected_output():
    hn.manual_seed(1)
    lin = nn.Linear(1, 6)

    def f(x):
        h = hn.zeros(2, 6)
        outs = []
        for t in range(x.shape[1]):
            h = hn.tanh(lin(x[:, t:t + 1]) + h * 0.5)
            outs.append(h.sum(1, keepdim=True))
        return hn.cat(outs, 1)

    x = hn.randn(2, 9)
    with hn.no_grad():
        tg = _recorded(f, x)
    graph, made = reroll(tg.graph)
    assert made == 1
    spec = _loops(graph)[0].attrs["spec"]
    assert spec.seqs == (SeqIn(dim=1, width=1, stride=1, anchor=0, gap=0),)
    assert Collect(1) in spec.collects and not any(n.op == "cat" for n in graph.nodes)
    arrays = _arrays(tg, [x])
    np.testing.assert_allclose(graph.run(*arrays)[0], tg.graph.run(*arrays)[0], rtol=1e-6)


def test_forward_and_backward_of_an_unrolled_rnn_reroll_together():
    cell = _cell("rnn")
    xs, target = hn.randn(12, 3, 4), hn.randn(3, 5)
    tg = _recorded(lambda x, y: F.mse_loss(_forward(cell, x), y), xs, target)
    wrt = [tg.graph.inputs[i] for i in tg.grad_inputs]
    joint = grad_graph(tg.graph, wrt, tg.grad_results, tg.blocked)
    graph, made = reroll(joint)
    graph.verify()
    assert made >= 2  # the forward loop, and the backward's reversed loop
    reversed_ = [s for n in _loops(graph) for s in n.attrs["spec"].seqs if s.stride < 0]
    assert reversed_, "the backward reads the forward's per-step values in reverse"
    assert len(_outside(graph)) < len(_outside(joint)) / 3
    arrays = _arrays(tg, [xs, target]) + [np.float32(1.0)]
    for a, b in zip(joint.run(*arrays), graph.run(*arrays)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_irregular_steps_stay_unrolled_and_correct():
    hn.manual_seed(2)
    lin = nn.Linear(5, 5)

    def f(xs):  # each step reads the one before last, and a per-step constant
        hs = [hn.zeros(3, 5), hn.zeros(3, 5)]
        for t in range(xs.shape[0]):
            hs.append(hn.tanh(lin(hs[-2]) + xs[t] * float(t + 1)))
        return hs[-1]

    xs = hn.randn(10, 3, 5)
    with hn.no_grad():
        tg = _recorded(f, xs)
    graph, _ = reroll(tg.graph)
    graph.verify()
    arrays = _arrays(tg, [xs])
    np.testing.assert_allclose(graph.run(*arrays)[0], tg.graph.run(*arrays)[0], rtol=1e-6)


def test_sequences_of_different_lengths_give_no_trip_count():
    seq = SeqIn(dim=0, width=1, stride=1, anchor=0, gap=0)
    assert seq.trip(7) == 7
    with pytest.raises(LoopTripError):
        SeqIn(dim=0, width=2, stride=2, anchor=0, gap=0).trip(7)
    cell = _cell("rnn")
    with hn.no_grad():
        tg = _recorded(lambda x: _forward(cell, x), hn.randn(5, 3, 4))
    spec = _loops(reroll(tg.graph)[0])[0].attrs["spec"]
    assert isinstance(spec, LoopSpec)
    with pytest.raises(LoopTripError):
        spec.trip_of([(0, 3, 4)])


def test_a_graph_without_repeats_is_left_alone():
    def f(x):
        return hn.relu(x * 2 + 1).sum()

    with hn.no_grad():
        tg = _recorded(f, hn.randn(4, 4))
    graph, made = reroll(tg.graph)
    assert made == 0 and not has_loops(graph)


# ---- the JIT: one compile for every length ---------------------------------------------------


def _grads(module):
    return [None if p.grad is None else p.grad.numpy().copy() for p in module.parameters()]


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_traced_loss_and_gradients_equal_eager_over_lengths_with_one_compile(kind):
    cell = _cell(kind)

    def loss_of(xs, target):
        return F.mse_loss(_forward(cell, xs), target)

    traced = hn.trace(loss_of, backend="numba")  # (llvm: test_llvm_lengths.py)
    rng = np.random.default_rng(0)
    lengths = [9, 13] + list(range(1, 101, 9)) + [100, 2, 9]
    for steps in lengths:
        xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
        target = hn.tensor(rng.standard_normal((3, 5)).astype(np.float32))
        same_loss_and_grads(traced, cell, xs, target)
    # (the second length is traced once more: its kernel is reused; lengths outside
    # 9..13 are traced once to confirm the code, until four confirmed: dynamic.Hull)
    stats = traced.stats
    assert stats.compiles <= 1 and stats.traces == 2 + stats.probes and \
        len(traced.specializations) == 1, stats
    # (lengths 1 and 2 trace no loop: probes, refuted, as the kernels' loops take them)
    assert stats.probes <= 6, stats
    # (short ones and probes run eagerly)
    assert stats.compiled_calls >= len(lengths) - 6 - stats.probes, stats
    assert any(e["kind"] == "generalize" for e in stats.events)


def test_inference_over_every_length_from_1_to_100_compiles_once():
    cell = _cell("rnn")
    traced = hn.trace(lambda xs: _forward(cell, xs, collect=True), backend="numba")
    rng = np.random.default_rng(1)
    with hn.no_grad():
        for steps in [20, 31] + list(range(1, 101)):
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            np.testing.assert_allclose(traced(xs).numpy(), _forward(cell, xs, collect=True).numpy(),
                                       rtol=1e-5, atol=1e-6)
    stats = traced.stats  # (probes: up to 4 below 20 and 4 above 31, then trusted)
    assert stats.compiles <= 1 and stats.traces == 2 + stats.probes and \
        stats.probes <= 8 and len(traced.specializations) == 1, stats


def test_dynamic_false_keeps_one_specialization_per_length():
    cell = _cell("rnn")
    traced = hn.trace(lambda xs: _forward(cell, xs), dynamic=False)
    with hn.no_grad():
        for steps in (6, 9, 12):
            xs = hn.randn(steps, 3, 4)
            np.testing.assert_allclose(traced(xs).numpy(), _forward(cell, xs).numpy(),
                                       rtol=1e-5, atol=1e-6)
    assert len(traced.specializations) == 3
    assert not any(e["kind"] == "generalize" for e in traced.stats.events)


def test_a_branch_on_a_value_inside_the_loop_gives_the_eager_result():
    cell = _cell("rnn")

    def f(xs):
        h = hn.zeros(3, 5)
        for t in range(xs.shape[0]):
            h = cell(xs[t], h)
            if float(h.sum()) > 0:  # a value guard per step
                h = h * 0.5
        return h

    traced = hn.trace(f)
    rng = np.random.default_rng(2)
    with hn.no_grad():
        for steps in (8, 8, 8, 11, 8, 11, 5):
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            np.testing.assert_allclose(traced(xs).numpy(), f(xs).numpy(), rtol=1e-5,
                                       atol=1e-6)


def test_a_size_only_python_reads_never_becomes_symbolic():
    """Regression (review): the loop length came from y's size while the loop sliced x;
    both sizes moved together in the first two calls, and x's extra frames were baked in
    as a fixed gap, so later calls ran the wrong number of steps."""
    cell = _cell("rnn", 4, 6)

    def f(x, y):
        h = hn.zeros(3, 6)
        for t in range(y.shape[0]):
            h = cell(x[t], h)
        return h + y.sum()

    traced = hn.trace(f)
    rng = np.random.default_rng(3)
    with hn.no_grad():
        for tx, ty in [(15, 5), (16, 6), (15, 5), (30, 5), (12, 8), (40, 20)]:
            x = hn.tensor(rng.standard_normal((tx, 3, 4)).astype(np.float32))
            y = hn.tensor(rng.standard_normal(ty).astype(np.float32))
            np.testing.assert_allclose(traced(x, y).numpy(), f(x, y).numpy(), rtol=1e-5,
                                       atol=1e-6)
    assert not any(e["kind"] == "generalize" for e in traced.stats.events)


def test_create_graph_through_a_generalized_call_of_another_length_raises_clearly():
    cell = _cell("rnn")
    traced = hn.trace(lambda xs: _forward(cell, xs).sum(), backend="numba")
    for steps in (8, 10):
        traced(hn.randn(steps, 3, 4)).backward()
    assert any(e["kind"] == "generalize" for e in traced.stats.events)
    out = traced(hn.randn(9, 3, 4))  # (inside 8..10: not a probe, which runs eagerly)
    assert traced.stats.compiled_calls >= 1
    with pytest.raises(RuntimeError, match="dynamic=False"):
        hn.grad(out, [cell.weight_ih], create_graph=True)


class _LM(nn.Module):
    """PyTorch's word language model, small: Embedding -> 2-layer LSTM -> Linear."""

    def __init__(self, ntok=40, width=12):
        super().__init__()
        self.ntok = ntok
        self.encoder = nn.Embedding(ntok, width)
        self.rnn = nn.LSTM(width, width, 2)
        self.decoder = nn.Linear(width, ntok)

    def forward(self, x, h, c):
        out, (h, c) = self.rnn(self.encoder(x), (h, c))
        return self.decoder(out).reshape(-1, self.ntok), h, c


def _lm_step(model, opt):
    def step(x, y, h, c):
        opt.zero_grad()
        out, h, c = model(x, h, c)
        loss = F.cross_entropy(out, y.reshape(-1))
        loss.backward()
        opt.step()
        return loss.detach(), h.detach(), c.detach()
    return step


def test_a_2_layer_lstm_language_model_trains_with_the_whole_step_traced_as_eagerly():
    models = []
    for _ in range(2):
        hn.manual_seed(5)
        model = _LM()
        models.append((model, _lm_step(model, hn.optim.SGD(model.parameters(), lr=0.5))))
    (m_eager, eager), (m_traced, step) = models
    traced = hn.trace(step)
    rng = np.random.default_rng(4)
    state = [(hn.zeros(2, 4, 12), hn.zeros(2, 4, 12)) for _ in range(2)]
    for _ in range(5):
        x = hn.tensor(rng.integers(0, 40, (9, 4)))
        y = hn.tensor(rng.integers(0, 40, (9, 4)))
        want, *state[0] = eager(x, y, *state[0])
        got, *state[1] = traced(x, y, *state[1])
        np.testing.assert_allclose(got.item(), want.item(), rtol=1e-5)
        for (name, a), b in zip(m_traced.named_parameters(), m_eager.parameters()):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-4,
                                       atol=1e-5,
                                       err_msg=name)
    result = next(iter(traced.specializations.values())).traces[0].result
    assert traced.stats.compiled_calls >= 3, traced.stats
    assert sum(n.op == "loop" for n in result.optimized.nodes) >= 4  # 2 layers, fwd + bwd


def test_the_gradient_of_each_steps_slice_is_gathered_not_added_full_size():
    cell = _cell("rnn")
    xs = hn.randn(10, 3, 4, requires_grad=True)
    tg = _recorded(lambda x: _forward(cell, x).sum(), xs)
    wrt = [tg.graph.inputs[i] for i in tg.grad_inputs]
    joint = grad_graph(tg.graph, wrt, tg.grad_results, tg.blocked)
    assert sum(n.op == "pad_slice" for n in joint.nodes) >= 10  # one full-size add a step
    graph, made = reroll(joint)
    graph.verify()
    assert made >= 2 and sum(n.op == "pad_slice" for n in graph.nodes) <= 1
    arrays = _arrays(tg, [xs]) + [np.float32(1.0)]
    for a, b in zip(joint.run(*arrays), graph.run(*arrays)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_generalized_function_follows_a_change_of_what_it_reads():
    cell = _cell("rnn")
    scale = [hn.tensor(np.float32(1.0))]

    def f(xs):
        return _forward(cell, xs) * scale[0]

    traced = hn.trace(f)
    rng = np.random.default_rng(6)
    with hn.no_grad():
        for steps in (8, 11, 14):
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            traced(xs)
        assert any(e["kind"] == "generalize" for e in traced.stats.events)
        scale[0] = hn.tensor(np.float32(2.0))  # (the list the trace read changed)
        for steps in (9, 17, 9, 23, 30):
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            np.testing.assert_allclose(traced(xs).numpy(), f(xs).numpy(), rtol=1e-5,
                                       atol=1e-6)


@pytest.mark.parametrize("how", ["part", "two_parts", "last_dim", "kept_dim"])
def test_step_slices_that_also_cut_another_dim(how):
    """Regression (review): x[t, B:] was read as x[t] (the fixed index on the other dims
    was dropped), and x[t, :B] and x[t, B:] were merged into one sequence."""
    cell = _cell("rnn", 4, 5)

    def step_input(x, t):
        if how == "part":
            return x[t, 3:]
        if how == "two_parts":
            return x[t, :3] * 2 + x[t, 3:]
        if how == "last_dim":
            return hn.cat([x[t, :3, 1:], x[t, :3, :1]], 1)
        return x[t:t + 1, 3:].sum(0)

    def f(x):
        h = hn.zeros(3, 5)
        for t in range(x.shape[0]):
            h = cell(step_input(x, t), h)
        return h

    traced = hn.trace(f)
    rng = np.random.default_rng(7)
    with hn.no_grad():
        for _ in range(3):
            x = hn.tensor(rng.standard_normal((9, 6, 4)).astype(np.float32))
            np.testing.assert_allclose(traced(x).numpy(), f(x).numpy(), rtol=1e-5, atol=1e-6)
    assert traced.stats.compiled_calls == 2


@pytest.mark.parametrize("cls,layers", [(nn.LSTM, 2), (nn.GRU, 1)])
def test_rnn_modules_compile_once_for_every_length(cls, layers):
    """Traced, nn.LSTM/GRU project each step's input inside the step (the batched product
    names steps * batch), so their loops generalize too."""
    hn.manual_seed(8)
    model = cls(4, 6, layers)
    traced = hn.trace(model, backend="numba")
    rng = np.random.default_rng(8)
    for steps in (9, 12, 20, 15, 31, 10, 25):  # (20 and 31: probes)
        x = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
        model.zero_grad()
        got = traced(x)[0]
        got.sum().backward()
        got_grads = _grads(model)
        model.zero_grad()
        want = model(x)[0]
        want.sum().backward()
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5,
                                   atol=1e-5)
        for a, b in zip(got_grads, _grads(model)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    assert len(traced.specializations) == 1 and traced.stats.compiled_calls >= 3, \
        traced.stats


def test_a_loop_nested_in_a_loop_rerolls_at_both_levels_and_generalizes_one_length():
    cell = _cell("rnn", 4, 6)

    def f(chunks):  # (chunks, steps, batch, features)
        h = hn.zeros(3, 6)
        for e in range(chunks.shape[0]):
            for t in range(chunks.shape[1]):
                h = cell(chunks[e, t], h)
            h = h * 0.5
        return h

    traced = hn.trace(f, backend="numba")
    rng = np.random.default_rng(7)
    # ((4, 9) -> (5, 9) makes the outer length symbolic; a specialization has one
    # symbolic length (its probes compare traces differing in it alone): inner length 12
    # is another specialization, whose outer length generalizes too)
    sizes = [(4, 9), (4, 9), (5, 9), (6, 9), (3, 9), (5, 12), (6, 12), (8, 12), (4, 9),
             (7, 12), (3, 20)]
    with hn.no_grad():
        for e, t in sizes:
            xs = hn.tensor(rng.standard_normal((e, t, 3, 4)).astype(np.float32))
            np.testing.assert_allclose(traced(xs).numpy(), f(xs).numpy(), rtol=1e-5,
                                       atol=1e-6)
    entries = [e for e in traced.specializations.values() if e.symbolic]
    assert len(entries) == 2 and all(e.symbolic == {(0, 0)} for e in entries), \
        [e.symbolic for e in entries]
    outer = _loops(entries[0].traces[0].result.optimized)
    assert len(outer) == 1 and len(_loops(outer[0].attrs["spec"].body)) == 1
    # (probes: 6 and 3 at inner length 9, 8 at 12; compiled: (4, 9) twice and (7, 12))
    assert traced.stats.probes == 3 and traced.stats.compiled_calls >= 3, traced.stats


def test_a_linear_over_the_stacked_outputs_generalizes_across_lengths():
    """A batched product with a 2-D weight (a Linear on the (steps, batch, hidden) outputs)
    is one GEMM naming no size, so the code is the same for every length."""
    cell = _cell("gru", 4, 6)
    hn.manual_seed(1)
    decoder = nn.Linear(6, 3)

    def f(xs):
        h, outs = hn.zeros(3, 6), []
        for t in range(xs.shape[0]):
            h = cell(xs[t], h)
            outs.append(h)
        return decoder(hn.stack(outs)).reshape(-1, 3).sum(1)

    traced = hn.trace(f, backend="numba")
    rng = np.random.default_rng(8)
    with hn.no_grad():
        for steps in (9, 12, 15, 20, 9, 31, 10, 18, 25):  # (15, 20, 31: probes)
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            np.testing.assert_allclose(traced(xs).numpy(), f(xs).numpy(), rtol=1e-5,
                                       atol=1e-6)
    assert any(e["kind"] == "generalize" for e in traced.stats.events), traced.stats.events
    assert traced.stats.compiled_calls >= 4, traced.stats



# ---- review regressions: which sizes may become symbolic -------------------------------------


def _rnn_calls(f, shapes, grad=False, seed=9):
    """Traced == eager for f(x) over inputs of `shapes` (no_grad unless `grad`)."""
    cell_free = hn.trace(f)
    rng = np.random.default_rng(seed)
    for shape in shapes:
        args = [hn.tensor(rng.standard_normal(s).astype(np.float32)) for s in shape]
        with hn.enable_grad() if grad else hn.no_grad():
            np.testing.assert_allclose(cell_free(*args).numpy(), f(*args).numpy(),
                                       rtol=1e-5, atol=1e-6)
    return cell_free


def test_an_inner_length_taken_from_the_outer_dim_is_not_made_symbolic():
    """(4, 6) then (5, 7): both dims moved with some loop's trips, but the inner loop
    slices dim 1 with a gap dim 0 sets; generalizing both gave wrong results."""
    cell = _cell("rnn", 4, 6)

    def f(x):
        h = hn.zeros(3, 6)
        for e in range(x.shape[0]):
            for t in range(x.shape[0]):  # (reads the first E frames of each row)
                h = cell(x[e, t], h)
            h = h * 0.5
        return h
    sizes = [(4, 6), (4, 6), (5, 7), (5, 7), (4, 9), (6, 12), (5, 5), (4, 9)]
    _rnn_calls(f, [((e, t, 3, 4),) for e, t in sizes])


def test_a_second_loop_counted_by_another_size_is_not_made_symbolic():
    cell = _cell("rnn", 4, 6)

    def f(x, y):
        h = hn.zeros(3, 6)
        for t in range(x.shape[0]):
            h = cell(x[t], h)
        for t in range(x.shape[0]):  # (slices y, counted by x)
            h = cell(y[t], h)
        return h
    sizes = [(5, 8), (5, 8), (6, 9), (6, 9), (5, 12), (7, 7), (9, 12)]
    _rnn_calls(f, [((a, 3, 4), (b, 3, 4)) for a, b in sizes])


def test_a_specialization_traced_after_a_size_became_symbolic_is_keyed_exactly():
    """Regression: once a length was symbolic every later key was masked, so a miss for
    another reason (the batch size) was traced at one length (here 1, not rerolled) and
    then served every length."""
    cell = _cell("rnn", 4, 6)

    def f(x):
        h = hn.zeros(x.shape[1], 6)
        for t in range(x.shape[0]):
            h = cell(x[t], h)
        return h
    sizes = [(9, 3), (9, 3), (12, 3), (12, 3), (1, 5), (9, 5), (9, 5), (3, 2), (5, 2),
             (14, 3)]
    traced = _rnn_calls(f, [((t, b, 4),) for t, b in sizes])
    assert traced.stats.compiled_calls >= 3


def test_sizes_made_symbolic_without_grad_do_not_serve_calls_with_grad():
    cell = _cell("rnn", 4, 6)

    def f(x):
        h = hn.zeros(3, 6)
        for e in range(x.shape[0]):
            for t in range(x.shape[1]):
                h = cell(x[e, t], h)
        return h.sum()
    rng = np.random.default_rng(10)
    traced = hn.trace(f)
    for e, t, grad in [(4, 9, False), (5, 9, False), (5, 12, False), (5, 12, True),
                       (6, 15, True), (8, 8, True), (6, 15, True)]:
        x = hn.tensor(rng.standard_normal((e, t, 3, 4)).astype(np.float32))
        if not grad:
            with hn.no_grad():
                np.testing.assert_allclose(traced(x).item(), f(x).item(), rtol=1e-5)
            continue
        same_loss_and_grads(traced, cell, x)


def test_a_batched_product_with_an_empty_inner_dim_compiles():
    w = hn.randn(0, 5)
    traced = hn.trace(lambda x: x @ w)
    for _ in range(3):
        x = hn.randn(2, 3, 0)
        np.testing.assert_array_equal(traced(x).numpy(), np.zeros((2, 3, 5), np.float32))
    assert traced.stats.compiled_calls >= 1


@pytest.mark.parametrize("backend,dynamic", [("numba", None), ("llvm", False)])
@pytest.mark.parametrize("part", ["rows-1:", "cols-::2"])
def test_summed_step_gradients_that_restrict_another_dim_land_in_place(part, backend, dynamic):
    """The gradient of x[t, 1:] (or x[t, :, ::2]) summed over the steps: the pieces'
    start and step in the other dims are kept when they are gathered (review)."""
    data = np.random.default_rng(0).standard_normal((4, 3, 5)).astype(np.float32)

    def f(x):
        if part == "rows-1:":
            return sum((x[t, 1:] * (t + 1.0)).sum() for t in range(x.shape[0]))
        return sum((x[t, :, ::2] * (t + 1.0)).sum() for t in range(x.shape[0]))
    x = hn.from_numpy(data.copy()).requires_grad_()
    f(x).backward()
    want = x.grad.numpy().copy()
    tf = hn.trace(f, backend=backend, dynamic=dynamic)
    for _ in range(3):
        x = hn.from_numpy(data.copy()).requires_grad_()
        tf(x).backward()
    np.testing.assert_array_equal(x.grad.numpy(), want)
    assert tf.stats.compiled_calls >= 1
