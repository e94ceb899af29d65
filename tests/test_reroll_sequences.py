"""Loops whose steps reach the loss through more than one collected sequence: an LSTM's
h and c both stacked, a sequence stacked twice, reversed or built front first, steps
picked out of it, the states before and after each step, a bidirectional RNN, stacks
that leave out the first steps; and a mean over the steps. With gradients, each
compiles once, by llvm, for every length (the backward reads its per-step gradient
slices, reshaped before the steps, as sequences: reroll._mapped_read; a cat of a run of
steps takes a slice of the loop's output, regrouped for hn.stack: reroll_edits.
replace_cats; a mean's count is witnessed by its gradient's copies: llvm_sym._witnessed).
"""

import numpy as np
import pytest

import hybridnet as hn
import hybridnet.nn as nn
import hybridnet.optim as optim

LENGTHS = (9, 13, 20, 31, 50, 64, 11, 40, 9)
CELLS = {"rnn": nn.RNNCell, "gru": nn.GRUCell, "lstm": nn.LSTMCell}


def _cells():
    hn.manual_seed(7)
    return {k: cls(4, 5) for k, cls in CELLS.items()}


def _step(cell, x, state):
    """(output, new state) of one step; an LSTM's state is (h, c)."""
    if isinstance(cell, nn.LSTMCell):
        h, c = cell(x, state)
        return h, (h, c)
    h = cell(x, state)
    return h, h


def _zero(cell):
    z = hn.zeros(3, 5)
    return (z, z) if isinstance(cell, nn.LSTMCell) else z


def lstm_h_and_c(m, xs):
    state, hs, cs = _zero(m["lstm"]), [], []
    for t in range(xs.shape[0]):
        _, state = _step(m["lstm"], xs[t], state)
        hs.append(state[0])
        cs.append(state[1])
    return hn.stack(hs), hn.stack(cs), state[1]


def stacked_twice(m, xs):
    h, hs = _zero(m["gru"]), []
    for t in range(xs.shape[0]):
        h = m["gru"](xs[t], h)
        hs.append(h)
    return hn.stack(hs), hn.stack(hs) * 2.0


def front_first(m, xs):
    h, hs = _zero(m["rnn"]), []
    for t in range(xs.shape[0]):
        h = m["rnn"](xs[t], h)
        hs.insert(0, h)
    return hn.stack(hs), h


def reversed_time(m, xs):
    h, hs = _zero(m["rnn"]), []
    for t in reversed(range(xs.shape[0])):
        h = m["rnn"](xs[t], h)
        hs.append(h)
    return hn.stack(hs[::-1]).tanh(), h


def picked(m, xs):
    h, hs = _zero(m["gru"]), []
    for t in range(xs.shape[0]):
        h = m["gru"](xs[t], h)
        hs.append(h)
    return hn.stack(hs), hs[3] * hs[-2], hs[0]


def before_and_after(m, xs):
    h, pre, post = _zero(m["rnn"]) + 0.5, [], []
    for t in range(xs.shape[0]):
        pre.append(h)
        h = m["rnn"](xs[t], h)
        post.append(h)
    return hn.stack(pre) - hn.stack(post), h


def bidirectional(m, xs):
    n = xs.shape[0]
    h, g, fs, bs = _zero(m["gru"]), _zero(m["rnn"]), [], []
    for t in range(n):
        h = m["gru"](xs[t], h)
        fs.append(h)
    for t in reversed(range(n)):
        g = m["rnn"](xs[t], g)
        bs.insert(0, g)
    return hn.cat([hn.stack(fs), hn.stack(bs)], dim=2), h + g


def over_a_list(m, xs):
    state, hs, cs = _zero(m["lstm"]), [], []
    for x in xs:
        _, state = _step(m["lstm"], x, state)
        hs.append(state[0])
        cs.append(state[1])
    return hn.stack(hs).sum(0) * hn.stack(cs).mean(0)


def mean_pooled(m, xs):  # (one sequence: its mean's gradient count once had no witness)
    h, hs = _zero(m["rnn"]), []
    for t in range(xs.shape[0]):
        h = m["rnn"](xs[t], h)
        hs.append(h)
    return hn.stack(hs).mean(0)


def _gru_states(m, xs):
    h, hs = _zero(m["gru"]), []
    for t in range(xs.shape[0]):
        h = m["gru"](xs[t], h)
        hs.append(h)
    return hs


def all_but_the_first(m, xs):  # (hn.stack of a run that leaves out the first steps)
    hs = _gru_states(m, xs)
    return hn.stack(hs[1:]), hn.stack(hs[2:-1]).tanh()


def all_but_the_first_reversed(m, xs):
    # (not with a second, overlapping run: stack(hs[:-1]) too adds two steps' gradient
    # slices, a two-input map that reroll._mapped_read does not read, and stays exact)
    hs = _gru_states(m, xs)
    return hn.stack(hs[1:][::-1]).tanh(), hs[-1]


SCENARIOS = {f.__name__: f for f in (lstm_h_and_c, stacked_twice, front_first,
                                     reversed_time, picked, before_and_after,
                                     bidirectional, over_a_list, mean_pooled,
                                     all_but_the_first, all_but_the_first_reversed)}


def _inputs(name, rng, steps):
    xs = rng.standard_normal((steps, 3, 4)).astype(np.float32)
    return [hn.tensor(x) for x in xs] if name == "over_a_list" else hn.tensor(xs)


def _loss(outs):
    outs = outs if isinstance(outs, tuple) else (outs,)
    return sum((o * o).sum() * float(i + 1) for i, o in enumerate(outs))


def _run(fn, m, xs):
    """(outputs, parameter gradients) of `fn` and the loss over them."""
    params = [p for c in m.values() for p in c.parameters()]
    for p in params:
        p.grad = None
    outs = fn(m, xs)
    _loss(outs).backward()
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = [None if p.grad is None else p.grad.numpy().copy() for p in params]
    return [o.detach().numpy().copy() for o in outs], grads


def _same(got, want, rtol, atol):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def _one_symbolic_llvm_kernel(traced):
    stats = traced.stats
    kinds = [e["kind"] for e in stats.events]
    # (a merge may fail once, when the first length traced another structure; never
    # with numba compiling instead)
    assert "generalize" in kinds and kinds.count("backend_fallback") <= 1, stats.events
    assert not any("numba" in e["detail"] and "llvm backend" not in e["detail"]
                   for e in stats.events), stats.events
    assert len(traced.specializations) == 1, stats.events
    entry, = traced.specializations.values()
    res = entry.traces[0].result
    assert res.backend == "llvm" and res.kernel.program.sym is not None
    assert res.backward is not None and res.backward.kernel.program.sym is not None
    return stats


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_gradients_equal_eager_at_every_length_with_one_kernel(name):
    fn, m = SCENARIOS[name], _cells()
    traced = hn.trace(fn)
    rng = np.random.default_rng(1)
    for steps in LENGTHS:
        xs = _inputs(name, rng, steps)
        got, got_grads = _run(traced, m, xs)
        want, want_grads = _run(fn, m, xs)
        _same(got, want, 1e-5, 1e-6)
        _same(got_grads, want_grads, 1e-4, 1e-5)
    stats = _one_symbolic_llvm_kernel(traced)
    traces = stats.traces
    # (the three traces that made it, and one more where the first merge found a shorter
    # length tracing another structure: picked steps at 9 leave no backward loop between;
    # and the probes, 31, 50 and 64 (and 9, 11) beyond the lengths it was made from)
    assert traces - stats.probes <= 4 and stats.probes <= 4, stats
    assert stats.compiled_calls >= len(LENGTHS) - traces, stats
    for steps in (17, 64, 9):  # (no new trace)
        xs = _inputs(name, rng, steps)
        got, got_grads = _run(traced, m, xs)
        want, want_grads = _run(fn, m, xs)
        _same(got, want, 1e-5, 1e-6)
        _same(got_grads, want_grads, 1e-4, 1e-5)
    assert traced.stats.traces == traces


def _train_step(model, opt):
    """A whole training step over a sequence, closing over `model` and `opt`."""
    def step(xs):
        opt.zero_grad()
        seq, cs, c = lstm_h_and_c(model, xs)
        loss = (seq * seq).mean() + (cs * 0.5).tanh().sum() * 0.01 + c.abs().mean()
        loss.backward()
        opt.step()
        return loss
    return step


def test_a_traced_training_step_keeps_the_eager_twin_with_one_kernel():
    twins = []
    for _ in range(2):
        m = _cells()
        opt = optim.Adam([p for c in m.values() for p in c.parameters()], lr=0.01)
        twins.append((m, opt, _train_step(m, opt)))
    traced = hn.trace(twins[0][2])
    rng = np.random.default_rng(2)
    for steps in LENGTHS + (17, 64):
        xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
        np.testing.assert_allclose(traced(xs).item(), twins[1][2](xs).item(), rtol=1e-5)
        (m0, opt0, _), (m1, opt1, _) = twins
        for a, b in zip(m0["lstm"].parameters(), m1["lstm"].parameters()):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(),
                                       rtol=1e-5, atol=1e-6)
            assert a.requires_grad and b.requires_grad
            for key, value in opt1.state[b].items():
                np.testing.assert_allclose(np.asarray(opt0.state[a][key]), np.asarray(value),
                                           rtol=1e-5, atol=1e-7)
    stats = traced.stats
    assert len(traced.specializations) == 1 and stats.traces - stats.probes <= 4, \
        stats.events
    assert "generalize" in [e["kind"] for e in stats.events], stats.events
    assert stats.compiled_calls >= len(LENGTHS) + 2 - stats.traces, stats
