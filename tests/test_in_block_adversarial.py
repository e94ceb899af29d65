"""Adversarial review of llvm_loop._in_block (a carried value the loop body also collects
is written into its block of the collected output, which the next step reads) and of
llvm_emit's skipped output copy between one pointer.

Oracles: eager hybridnet after every call (outputs, final states, parameter gradients,
optimizer state and parameters after optimizer steps; results of earlier calls must not
change); the calls ran compiled, the loops were rerolled, and a in_block_spy on _in_block says
which loops took the path (a strided block must not).
"""

import numpy as np
import pytest
from trace_helpers import weighted_call

import hybridnet as hn
import hybridnet.nn as nn
import hybridnet.nn.functional as F

# (repeats: exact kernels; then symbolic: 31, 50 and 64 are probes, dynamic.Hull, the
# lengths after them run compiled)
LENGTHS = (9, 9, 13, 13, 20, 31, 7, 50, 5, 64, 40, 17, 55, 25)
EXACT = (9, 9, 13, 13)
# (picked steps: a loop needs 8 steps, and at 9 its backward traces another structure)
PICKED = (9, 9, 13, 13, 20, 31, 50, 64, 40, 33, 7, 45, 20, 60)


def _close(got, want, rtol, atol):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape)
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def _drive(fn, params, make, lengths, grad, seed=0):
    """`hn.trace(fn)` and `fn` on inputs of each length: results and gradients equal
    after every call, and each traced result unchanged by the next traced call."""
    traced = hn.trace(fn)
    rng = np.random.default_rng(seed)
    kept = None
    for steps in lengths:
        args = make(rng, steps)
        outs, got, got_grads = weighted_call(traced, params, args, grad)
        _, want, want_grads = weighted_call(fn, params, args, grad)
        _close(got, want, 1e-5, 1e-6)
        _close(got_grads, want_grads, 1e-4, 1e-5)
        if kept is not None:  # (the last call's outputs: not overwritten by this one)
            _close([o.detach().numpy() for o in kept[0]], kept[1], 0, 0)
        kept = outs, got
    assert "rerolled loops" in str(hn.explain(traced))
    return traced


def _seqs(b=3, i=4, dtype=np.float32):
    return lambda rng, steps: (hn.tensor(rng.standard_normal((steps, b, i)).astype(dtype)),)


def _run(cell, xs, h, order=None, after=None, front=False):
    """(final state, every step's state (or `after` of it)) of `cell` over `xs`."""
    hs = []
    for t in order if order is not None else range(xs.shape[0]):
        h = cell(xs[t], h)
        hs.insert(len(hs) * (not front), h if after is None else after(h))
    return h, hs


# ---- scenarios: fn(xs, m) with m the cells of _Cells -----------------------------------


class _Cells:
    def __init__(self, dtype=np.float32, batch=3, hidden=5):
        hn.manual_seed(11)
        self.dtype, self.b, self.h = dtype, batch, hidden
        kw = {} if dtype == np.float32 else {"dtype": dtype}
        self.rnn, self.gru = nn.RNNCell(4, hidden, **kw), nn.GRUCell(4, hidden, **kw)
        self.lstm, self.tied = nn.LSTMCell(4, hidden, **kw), nn.RNNCell(hidden, hidden, **kw)
        self.lin = nn.Linear(4, hidden, **kw)
        self.params = [p for m in (self.rnn, self.gru, self.lstm, self.tied, self.lin)
                       for p in m.parameters()]


def _zeros(m, *shape):
    """Zeros of the cells' dtype, of shape (batch, hidden) or `shape`."""
    return hn.zeros(*(shape or (m.b, m.h)), dtype=m.dtype)


def _over(results, cell="rnn", backwards=False, **kw):
    """A scenario: `results(h, hs)` of the cell over xs from zeros."""
    def fn(xs, m):
        order = reversed(range(xs.shape[0])) if backwards else None
        return results(*_run(getattr(m, cell), xs, _zeros(m), order=order, **kw))
    return fn


def lstm_h_and_c(xs, m):
    h = c = _zeros(m)
    hs, cs = [], []
    for t in range(xs.shape[0]):
        h, c = m.lstm(xs[t], (h, c))
        hs.append(h)
        cs.append(c)
    return hn.stack(hs), hn.stack(cs), h, c


def final_state_after(xs, m):
    h, hs = _run(m.rnn, xs, _zeros(m))
    seq = hn.stack(hs)
    return seq + h, (h * 3.0).tanh(), seq


def seq_updated_in_place(xs, m):  # (the final state is no view of the stacked states)
    h, hs = _run(m.gru, xs, _zeros(m))
    seq = hn.stack(hs)
    seq.mul_(-2.0)
    return seq, h * 1.0


def transposed_carry(xs, m):  # (the state carried as (hidden, batch): a permuted view)
    ht, hs = _zeros(m, m.h, m.b), []
    for t in range(xs.shape[0]):
        ht = m.rnn(xs[t], ht.t()).t()
        hs.append(ht)
    return hn.stack(hs), ht


def reshaped_carry(xs, m):
    h, hs = _zeros(m, m.b * m.h), []
    for t in range(xs.shape[0]):
        h = m.rnn(xs[t], h.reshape(m.b, m.h)).reshape(m.b * m.h)
        hs.append(h.reshape(m.b, m.h))
    return hn.stack(hs[::-1]), h


def before_and_after(xs, m):
    h, pre, post = _zeros(m) + 0.5, [], []
    for t in range(xs.shape[0]):
        pre.append(h)
        h = m.rnn(xs[t], h)
        post.append(h)
    return hn.stack(pre), hn.stack(post), h


def read_twice(xs, m):
    h, hs = _zeros(m), []
    for t in range(xs.shape[0]):
        h = m.rnn(xs[t], h) * 0.5 + h * h * 0.3 + h.t().t() * 0.1
        hs.append(h)
    return hn.stack(hs), h


def two_carried_one_value(xs, m):
    h, g, hs = _zeros(m), _zeros(m) + 0.5, []
    for t in range(xs.shape[0]):
        h = m.gru(xs[t], h + g * 0.1)
        g = h
        hs.append(h)
    return hn.stack(hs), h * 1.0, g * 2.0


def with_initial(xs, m):
    h0 = _zeros(m) + 0.3
    h, hs = _run(m.rnn, xs, h0)
    return hn.stack([h0] + hs), h


def in_place_in_step(xs, m):  # (no_grad only: eager refuses its backward)
    h, hs = _zeros(m), []
    for t in range(xs.shape[0]):
        h = m.rnn(xs[t], h)
        hs.append(h)
        h.mul_(0.5)
    return hn.stack(hs), h * 1.0


def bidirectional(xs, m):
    h, fs = _run(m.gru, xs, _zeros(m))
    g, bs = _run(m.rnn, xs, _zeros(m), order=reversed(range(xs.shape[0])), front=True)
    return hn.cat([hn.stack(fs), hn.stack(bs)], dim=2), h, g


def two_layers(xs, m):
    h, hs = _run(m.gru, xs, _zeros(m))
    seq = hn.stack(hs)
    g, gs = _run(m.tied, seq, h * 0.5)
    return hn.stack(gs), g, seq


def tied_layers_nested(xs, m):
    seq = hn.stack(_run(m.gru, xs, _zeros(m))[1])
    for _ in range(3):
        g, gs = _run(m.tied, seq, _zeros(m))
        seq = hn.stack(gs)
    return seq, g


def first_and_last_peeled(xs, m):
    h0 = m.gru(xs[0])
    h, hs = _run(m.gru, xs, h0, order=range(1, xs.shape[0] - 1))
    last = m.rnn(xs[xs.shape[0] - 1], h)
    return hn.stack([h0] + hs + [last]), last


def state_modules(xs, m):
    out, h = m.rnn_seq(xs)
    seq, (hl, cl) = m.lstm_seq(xs)
    return out, h, seq, hl, cl


def three_d_dim1(xs, m):  # ((batch, 1, hidden) blocks along dim 1: strided)
    h, hs = _zeros(m, m.b, 1, m.h), []
    for t in range(xs.shape[0]):
        h = m.rnn(xs[t], h.reshape(m.b, m.h)).reshape(m.b, 1, m.h)
        hs.append(h)
    return hn.cat(hs, dim=1), h


def scalar_state(xs, m):
    s, ss = _zeros(m, ()), []
    for t in range(xs.shape[0]):
        s = s * 0.9 + (xs[t] * m.lin.weight[0]).sum()
        ss.append(s)
    return hn.stack(ss), s


# name: (fn, in-block expected (None: either way; the scalar loop carries s * 0.9,
# rotated, not s), lengths for the gradient test (None: no_grad only))
SCENARIOS = {
    "lstm_h_and_c": (lstm_h_and_c, True, LENGTHS),
    "stack_and_cat0": (_over(lambda h, hs: (hn.stack(hs), hn.cat(hs, dim=0), h), "gru"),
                       True, LENGTHS),
    "stacked_twice": (_over(lambda h, hs: (hn.stack(hs), hn.stack(hs) * 2.0)), True, LENGTHS),
    "times_one": (_over(lambda h, hs: (hn.stack(hs), h), after=lambda h: h * 1.0),
                  True, LENGTHS),
    "cat0_reversed": (_over(lambda h, hs: (hn.cat(hs[::-1], dim=0), h), "gru"), True, LENGTHS),
    "front_inserted": (_over(lambda h, hs: (hn.stack(hs), h), front=True), True, LENGTHS),
    "backward_time_stack_reversed": (_over(lambda h, hs: (hn.stack(hs[::-1]), h),
                                           backwards=True), True, LENGTHS),
    "picked_steps": (_over(lambda h, hs: (hn.stack(hs), hs[3], hs[-1], hs[0], hs[-2])),
                     True, PICKED),
    "final_state_after": (final_state_after, True, LENGTHS),
    "seq_updated_in_place": (seq_updated_in_place, True, None),
    "transposed_carry": (transposed_carry, True, LENGTHS),
    "reshaped_collect": (_over(lambda h, hs: (hn.stack(hs), h),
                               after=lambda h: h.reshape(h.shape[0] * h.shape[1])),
                         True, LENGTHS),
    "reshaped_carry": (reshaped_carry, True, None),
    "before_and_after": (before_and_after, True, LENGTHS),
    "read_twice": (read_twice, True, LENGTHS),
    "two_carried_one_value": (two_carried_one_value, True, None),
    "with_initial": (with_initial, True, None),
    "in_place_in_step": (in_place_in_step, True, None),
    "bidirectional": (bidirectional, True, LENGTHS),
    "two_layers": (two_layers, True, LENGTHS),
    "tied_layers_nested": (tied_layers_nested, True, None),
    "first_and_last_peeled": (first_and_last_peeled, True, None),
    "state_modules": (state_modules, True, LENGTHS),
    "batch1_cat1": (_over(lambda h, hs: (hn.cat(hs, dim=1), hn.stack(hs, dim=1), h), "gru"),
                    True, None),
    "three_d_dim1": (three_d_dim1, False, LENGTHS),
    "hidden1_cat1": (_over(lambda h, hs: (hn.cat(hs, dim=1), hn.stack(hs, dim=2), h)),
                     False, None),
    "scalar_state": (scalar_state, None, None),
}
SCENARIOS["float64"] = SCENARIOS["stack_and_cat0"]
SCENARIOS["batch1_hidden1"] = SCENARIOS["picked_steps"][:2] + (None,)
SIZES = {  # name: (batch, hidden, dtype), else (3, 5, np.float32)
    "float64": (3, 5, np.float64),
    "batch1_hidden1": (1, 1, np.float32),
    "batch1_cat1": (1, 5, np.float32),
    "hidden1_cat1": (3, 1, np.float32),
}


def _bound(name):
    fn = SCENARIOS[name][0]
    batch, hidden, dtype = SIZES.get(name, (3, 5, np.float32))
    m = _Cells(dtype, batch, hidden)
    if fn is state_modules:
        m.rnn_seq, m.lstm_seq = nn.RNN(4, 5), nn.LSTM(4, 5)
        m.params += list(m.rnn_seq.parameters()) + list(m.lstm_seq.parameters())
    return (lambda xs: fn(xs, m)), m, _seqs(batch, 4, dtype)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_forward_at_every_length_matches_eager(in_block_spy, name):
    fn, m, make = _bound(name)
    traced = _drive(fn, m.params, make, LENGTHS, False)
    assert traced.stats.compiled_calls >= 2, traced.stats
    assert in_block_spy, "no loop was lowered"
    in_block = SCENARIOS[name][1]
    assert in_block is None or any(in_block_spy) == in_block, in_block_spy
    if name in ("lstm_h_and_c", "two_carried_one_value"):  # (two carried values each)
        assert any(len(found) == 2 for found in in_block_spy), in_block_spy


@pytest.mark.parametrize("name", sorted(n for n, s in SCENARIOS.items() if s[2]))
def test_gradients_match_eager(in_block_spy, name):
    fn, m, make = _bound(name)
    lengths = SCENARIOS[name][2]
    traced = _drive(fn, m.params, make, lengths, True)
    assert traced.stats.compiled_calls >= 2, traced.stats
    # (forward or backward loops; a forward whose blocks are strided has a backward
    # loop that carries gradients only, compiler.loop_grad: nothing in block there)
    assert any(in_block_spy) or SCENARIOS[name][1] is False, in_block_spy
    if lengths in (LENGTHS, PICKED):
        assert any(e.symbolic for e in traced.specializations.values()), traced.stats.events
        assert traced.stats.compiled_calls >= 6, traced.stats


@pytest.mark.parametrize("kind,optimizer", [("rnn", "sgd"), ("lstm", "adam"),
                                            ("gru", "adam"), ("gru", "sgd")])
def test_traced_training_steps_keep_the_eager_twin(in_block_spy, kind, optimizer):
    """zero_grad, forward over every step (the gru backwards in time), backward and an
    optimizer step, all traced; an eager twin from the same seed gets the same data."""
    def make():
        hn.manual_seed(5)
        cell = {"lstm": nn.LSTMCell, "gru": nn.GRUCell, "rnn": nn.RNNCell}[kind](4, 6)
        head = nn.Linear(6, 2)
        params = list(cell.parameters()) + list(head.parameters())
        opt = hn.optim.SGD(params, lr=0.05, momentum=0.9) if optimizer == "sgd" else \
            hn.optim.Adam(params, lr=0.01)

        def step(xs, y):
            opt.zero_grad()
            h = c = hn.zeros(3, 6)
            hs = []
            for t in reversed(range(xs.shape[0])) if kind == "gru" else range(xs.shape[0]):
                if kind == "lstm":
                    h, c = cell(xs[t], (h, c))
                else:
                    h = cell(xs[t], h)
                hs.append(h)
            seq = hn.stack(hs)
            loss = F.mse_loss(head(h), y) + (seq * seq).sum() * 0.01
            loss.backward()
            opt.step()
            return loss.detach()
        return step, params, opt
    step, params, opt = make()
    traced = hn.trace(step)
    twin, twin_params, twin_opt = make()
    rng = np.random.default_rng(6)
    for steps in (9, 9, 9, 13, 13, 13, 9, 13):
        xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
        y = hn.tensor(rng.standard_normal((3, 2)).astype(np.float32))
        _close([traced(xs, y).numpy()], [twin(xs, y).numpy()], 1e-5, 1e-6)
        for p, q in zip(params, twin_params):
            _close([p.detach().numpy(), p.grad.numpy()],
                   [q.detach().numpy(), q.grad.numpy()], 1e-4, 1e-6)
            state, want = opt.state[p], twin_opt.state[q]
            assert sorted(state) == sorted(want)
            for key in want:
                _close([_array(state[key])], [_array(want[key])], 1e-4, 1e-7)
    assert traced.stats.compiled_calls >= 4, traced.stats
    assert any(in_block_spy), in_block_spy


def _array(value):
    return np.asarray(value.numpy() if hasattr(value, "numpy") else value)


def test_wide_states_with_two_blas_threads(in_block_spy, two_threads):
    hn.manual_seed(12)
    cell = nn.GRUCell(32, 128)

    def fn(xs):
        h, hs = _run(cell, xs, hn.zeros(256, 128), order=reversed(range(xs.shape[0])))
        return hn.stack(hs), h
    make = _seqs(256, 32)
    traced = _drive(fn, list(cell.parameters()), make, (9, 9, 13, 13, 20, 31), False)
    traced = _drive(fn, list(cell.parameters()), make, (9, 9, 13), True)
    assert traced.stats.compiled_calls >= 1, traced.stats
    assert any(in_block_spy), in_block_spy


def test_returned_list_of_states_matches_eager(in_block_spy):
    """Every step's state returned as its own result (no stack): each result is its own
    array, equal to eager's; the loop collects them apart from the carried state."""
    hn.manual_seed(13)
    cell = nn.RNNCell(4, 5)

    def fn(xs):
        return _run(cell, xs, hn.zeros(3, 5))[1]
    traced = _drive(fn, list(cell.parameters()), _seqs(), EXACT + (20, 9, 13), False)
    assert traced.stats.compiled_calls >= 2, traced.stats
    with hn.no_grad():
        xs = _seqs()(np.random.default_rng(1), 9)[0]
        first = traced(xs)
        first[0].add_(100.0)  # (a result is no view of another)
        want = fn(xs)
    _close([h.numpy() for h in first[1:]], [h.numpy() for h in want[1:]], 1e-5, 1e-6)
    assert in_block_spy, "no loop was lowered"
