"""A loop takes in the steps peeled off its front (compiler.reroll_peel).

Oracles: the reference interpreter on the unrolled graph (the rerolled graph computes the
same values), the same reroll without absorption (it must leave more unrolled), and eager
hybridnet for whole traced training steps over several lengths.
"""

import numpy as np
import pytest

import hybridnet as hn
import hybridnet.nn as nn
import hybridnet.nn.functional as F
from compiler import reroll_peel
from compiler.autodiff import grad_graph
from compiler.reroll import reroll

CELLS = {"rnn": nn.RNNCell, "lstm": nn.LSTMCell, "gru": nn.GRUCell}


def _joint(kind, steps, extra=None, every_step=True):
    """The unrolled forward + backward graph of an MSE loss over a cell's loop (of every
    step's output, or of the final state), and the arrays to run it on."""
    hn.manual_seed(0)
    cell = CELLS[kind](4, 5)
    xs, target = hn.randn(steps, 3, 4), hn.randn(3, 5)

    def loss(xs, target):
        state = (hn.zeros(3, 5),) * (2 if kind == "lstm" else 1)
        outs = []
        for t in range(xs.shape[0]):
            out = cell(xs[t], state if kind == "lstm" else state[0])
            state = out if kind == "lstm" else (out,)
            outs.append(state[0])
        h = state[0]
        value = F.mse_loss(hn.stack(outs).sum(0) if every_step else h, target)
        return value if extra is None else value + extra(h)

    traced = hn.trace(loss)
    traced(xs, target)
    tg = next(iter(traced.specializations.values())).traces[0].tg
    wrt = [tg.graph.inputs[i] for i in tg.grad_inputs]
    joint = grad_graph(tg.graph, wrt, tg.grad_results, tg.blocked)
    arrays = [(xs if s.kind == "arg" and s.index == 0 else target if s.kind == "arg"
               else s.ref()).detach().numpy() for s in tg.sources]
    return joint, arrays + [np.float32(1.0)]


def _outside(graph):
    return [n for n in graph.nodes if not n.is_source and n.op not in ("loop", "loop_out")]


def _without_absorption(monkeypatch, joint):
    with monkeypatch.context() as m:
        m.setattr(reroll_peel, "MAX_PEEL", 0)
        return reroll(joint)[0]


@pytest.mark.parametrize("kind,steps,absorbs", [
    ("lstm", 12, True), ("gru", 12, True), ("lstm", 20, True),
    ("rnn", 12, False), ("lstm", 5, False), ("gru", 5, False)])
def test_a_backward_loop_takes_in_its_peeled_first_steps(kind, steps, absorbs, monkeypatch):
    """LSTM and GRU backward loops whose first steps are the body from zero carried
    values take them in (a tanh RNN's are not: its peeled steps stay, still right)."""
    joint, arrays = _joint(kind, steps)
    rolled, made = reroll(joint)
    rolled.verify()
    plain = _without_absorption(monkeypatch, joint)
    if absorbs:
        assert made >= 2
        assert len(_outside(rolled)) < 0.6 * len(_outside(plain)), \
            "the peeled steps in front of the backward loop are gone"
    else:
        assert len(_outside(rolled)) == len(_outside(plain))
    want = joint.run(*arrays)
    for a, b in zip(want, rolled.run(*arrays)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["rnn", "lstm"])
def test_a_first_step_that_is_not_the_body_from_zeros_stays_peeled(kind, monkeypatch):
    """A loss of the final state only: the backward's first step starts from the loss's
    gradient, which no body from zero carried values computes (here two terms of it).
    Whatever is absorbed or not, the values are the unrolled graph's."""
    joint, arrays = _joint(kind, 7, extra=lambda h: (h * h * 3.0).sum(), every_step=False)
    rolled, _ = reroll(joint)
    rolled.verify()
    for a, b in zip(joint.run(*arrays), rolled.run(*arrays)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_absorbed_loops_run_other_lengths_through_the_loop_impl():
    """The absorbed loop's sequences and trip count follow the input sizes: the graph
    rerolled at 9 steps, run by the interpreter on 9 steps' arrays, matches; and its
    loop node's trip count is the full length (the peeled steps are inside)."""
    joint, arrays = _joint("lstm", 9)
    rolled, _ = reroll(joint)
    trips = sorted(n.attrs["spec"].trip_of([i.shape for i in n.inputs[
        n.attrs["spec"].n_carried + n.attrs["spec"].n_invariant:]])
        for n in rolled.nodes if n.op == "loop")
    assert trips[-1] >= 8
    for a, b in zip(joint.run(*arrays), rolled.run(*arrays)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_language_model_step_traced_equals_eager_with_less_code(monkeypatch):
    """A 2-layer LSTM language model's whole training step (SGD): traced == eager over
    lengths 12, 12, 7, 12, 5 (symbolic lengths, one compile), and the compiled step has
    fewer nodes outside its loops than without absorption."""
    def model_and_step():
        hn.manual_seed(0)
        embed, rnn, head = nn.Embedding(50, 16), nn.LSTM(16, 16, 2), nn.Linear(16, 50)
        params = [*embed.parameters(), *rnn.parameters(), *head.parameters()]
        opt = hn.optim.SGD(params, lr=0.5)

        def step(x, y):
            opt.zero_grad()
            out, _ = rnn(embed(x))
            loss = F.cross_entropy(head(out.reshape(-1, 16)), y)
            loss.backward()
            opt.step()
            return loss.detach()
        return params, step

    rng = np.random.default_rng(0)
    data = [(hn.from_numpy(rng.integers(0, 50, (n, 4))), hn.from_numpy(rng.integers(0, 50, n * 4)))
            for n in (12, 12, 7, 12, 5, 12, 9, 12)]
    params_e, step_e = model_and_step()
    params_t, step_t = model_and_step()
    traced = hn.trace(step_t)
    for x, y in data:
        np.testing.assert_allclose(traced(x, y).item(), step_e(x, y).item(), rtol=1e-5)
        for a, b in zip(params_t, params_e):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5,
                                       atol=1e-6)
    assert traced.stats.compiled_calls >= 3 and traced.stats.compiles == 1
    graph = next(iter(traced.specializations.values())).traces[0].tg.graph
    rolled = reroll(graph)[0]
    plain = _without_absorption(monkeypatch, graph)
    assert len(_outside(rolled)) < 0.8 * len(_outside(plain))


def _weighted_step_graph(kind, steps):
    """The trace graph of a whole training step (Adam) of a loss weighting each step's
    output by a per-step tensor."""
    hn.manual_seed(0)
    cell = CELLS[kind](4, 5)
    opt = hn.optim.Adam(cell.parameters(), lr=0.01, weight_decay=0.01)

    def step(xs, w):
        opt.zero_grad()
        h, c, outs = hn.zeros(3, 5), hn.zeros(3, 5), []
        for t in range(xs.shape[0]):
            if kind == "lstm":
                h, c = cell(xs[t], (h, c))
            else:
                h = cell(xs[t], h)
            outs.append(h)
        loss = (hn.stack(outs) * w[:len(outs)].reshape(-1, 1, 1)).sum()
        loss.backward()
        opt.step()
        return loss.detach()
    traced = hn.trace(step)
    xs, w = hn.randn(steps, 3, 4), hn.randn(50)
    for _ in range(2):
        traced(xs, w)
    return next(iter(traced.specializations.values())).traces[0].tg.graph


def _assert_in_order(rolled):
    """Every node after its inputs, and each loop's projections right after it."""
    rolled.verify()
    for i, node in enumerate(rolled.nodes):
        if node.op == "loop":
            n_outs = sum(1 for n in rolled.nodes if n.op == "loop_out" and n.inputs[0] is node)
            following = rolled.nodes[i + 1:i + 1 + n_outs]
            assert all(n.op == "loop_out" and n.inputs[0] is node for n in following)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("steps", [3, 4, 12])
def test_absorbed_graphs_keep_execution_order_and_projections_after_their_loop(kind,
                                                                               steps):
    """Regression: the rewrite ordered the graph by a depth-first sort, which put a
    loop's projections away from it; the numba backend's split driver then read a
    projection in a kernel before the one that computed it (UnboundLocalError)."""
    graph = _weighted_step_graph(kind, steps)
    rolled, _ = reroll(graph)
    _assert_in_order(rolled)
    joint, arrays = _joint(kind, steps)
    rolled, _ = reroll(joint)
    _assert_in_order(rolled)
    for a, b in zip(joint.run(*arrays), rolled.run(*arrays)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
