"""Adversarial review of f8e596e: products leave rerolled loops (compiler.loop_hoist),
uniform constant folds become a broadcast scalar (compiler.passes.constfold), and one
llvm kernel computes a mean's count from the length (compiler.lowering.llvm_sym).

Oracle: an eager twin (the same function, untraced, identical initial parameters) run
on the same data; after every call the results and the state left behind (parameters,
.grad, optimizer state) must agree with float32 tolerances. Tests that pass document
attacks that failed; the tests under "bugs" fail on f8e596e.
"""

import json

import numpy as np
import pytest

import hybridnet as hn
import hybridnet.nn as nn
from hybridnet.export_load import loads

RTOL, ATOL = 1e-4, 1e-5


def _x(*shape, seed=0, dtype=np.float32):
    return hn.tensor(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def _param(*shape, seed, dtype=np.float32):
    return nn.Parameter(_x(*shape, seed=seed, dtype=dtype) * 0.5)


def _flat(v):
    if isinstance(v, (tuple, list)):
        return [y for x in v for y in _flat(x)]
    return [v]


def _np(t):
    if t is None:
        return None
    return t.detach().numpy().copy() if hasattr(t, "detach") else np.asarray(t)


def _close(a, b, msg):
    if a is None or b is None:
        assert a is None and b is None, msg
        return
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=RTOL, atol=ATOL, err_msg=msg)


def _state(params, opt):
    out = []
    for p in params:
        out += [_np(p), _np(p.grad)]
    if opt is not None:
        for p in params:
            st = opt.state.get(p, {})
            out += [_np(st[k]) if hasattr(st[k], "detach") else np.asarray(st[k], np.float64)
                    for k in sorted(st)]
    return out


def _twin(make, calls, backend="llvm", no_grad=False):
    """make() -> (fn, params, optimizer or None), called twice: one traced, one eager.
    Results and state must agree after every call; returns the traced function."""
    fa, pa, oa = make()
    fb, pb, ob = make()
    traced = hn.trace(fa, backend=backend)
    for i, args in enumerate(calls):
        if no_grad:
            with hn.no_grad():
                got, want = traced(*args), fb(*args)
        else:
            got, want = traced(*args), fb(*args)
        got, want = _flat(got), _flat(want)
        assert len(got) == len(want)
        for j, (g, w) in enumerate(zip(got, want)):
            _close(_np(g), _np(w), f"call {i}: result {j}")
        for j, (g, w) in enumerate(zip(_state(pa, oa), _state(pb, ob))):
            _close(g, w, f"call {i}: state {j}")
    return traced


def _hoisted(traced) -> bool:
    """Some trace of `traced` had a product moved out of a loop."""
    return any(r["name"] == "loop_hoist" and r["changed"]
               for e in traced.specializations.values() for tr in e.traces
               if tr.result is not None for r in tr.result.pass_report)


# ---- forward-only loop shapes the rewrites meet (no_grad), over symbolic lengths --------


def _collect_previous_state(x, w, u, v):  # a collected product of the carried *input*
    h, outs = hn.zeros(2, 4), []
    for t in range(x.shape[0]):
        outs.append(h @ v)
        h = (x[t] @ w + h @ u).tanh()
    return hn.stack(outs), h


def _collect_projection(x, w, u, v):  # the collected value becomes a sequence input
    h, outs = hn.zeros(2, 4), []
    for t in range(x.shape[0]):
        outs.append(x[t] @ v)
        h = (x[t] @ w + h @ u).tanh()
    return hn.cat(outs, 0), h


def _carry_projection(x, w, u, v):  # a carried value that is a hoisted projection
    h, g = hn.zeros(2, 4), hn.zeros(2, 4)
    for t in range(x.shape[0]):
        g2 = x[t] @ w
        h = (g + h @ u).tanh()
        g = g2
    return h, g


def _accumulate_by_invariant(x, w, u, v):  # acc + h @ V: V collected once per step
    h, acc = hn.zeros(2, 4), hn.ones(2, 3) * 2
    for t in range(x.shape[0]):
        h = (x[t] @ w + h @ u).tanh()
        acc = acc + h @ v
    return acc, acc * 2, h


def _accumulate_invariants(x, w, u, v):  # acc + U @ V: both factors invariant
    h, acc = hn.zeros(2, 4), hn.ones(4, 3)
    for t in range(x.shape[0]):
        h = (x[t] @ w + h @ u).tanh()
        acc = acc + u @ v
    return acc, h


def _accumulate_gram_of_input(x, w, u, v):  # acc + x[t].T @ x[t]: sequence inputs
    h, acc = hn.zeros(2, 4), hn.ones(4, 4)
    for t in range(x.shape[0]):
        h = (x[t] @ w + h @ u).tanh()
        acc = acc + x[t].t() @ x[t]
    return acc, h


def _picked_steps(x, w, u, v):
    h, outs = hn.zeros(2, 4), []
    for t in range(x.shape[0]):
        h = (x[t] @ w + h @ u).tanh()
        outs.append(h @ v)
    return hn.stack(outs), outs[-1], outs[0] * 2


def _chained_projection(x, w, u, v):  # (x[t] @ W) @ V: hoisted twice
    h = hn.zeros(2, 3)
    for t in range(x.shape[0]):
        h = ((x[t] @ w) @ v + h @ u[:3, :3]).tanh()
    return h


def _same_product_summed_and_collected(x, w, u, v):
    h, acc, outs = hn.zeros(2, 4), hn.zeros(2, 3), []
    for t in range(x.shape[0]):
        h = (x[t] @ w + h @ u).tanh()
        p = h @ v
        acc = acc + p
        outs.append(p)
    return acc, hn.stack(outs)


def _collect_along_columns(x, w, u, v):  # cat along the product's last dim: not sunk
    h, outs = hn.zeros(2, 4), []
    for t in range(x.shape[0]):
        h = (x[t] @ w + h @ u).tanh()
        outs.append(h @ v)
    return hn.cat(outs, 1), (hn.cat([o.reshape(6) for o in outs], 0) * 2)


def _nonfinite_rows_skipped(x, w, u, v):  # the hoisted product covers rows never read
    h = hn.zeros(2, 4)
    for t in range(1, x.shape[0] - 1):
        h = (x[t] @ w + h @ u).tanh()
    return h


def _nan_accumulator(x, w, u, v):
    h, acc = hn.zeros(2, 4), hn.full((2, 3), float("nan")) * 1.0
    for t in range(x.shape[0]):
        h = (x[t] @ w + h @ u).tanh()
        acc = acc + h @ v
    return acc, h


FORWARD = [_collect_previous_state, _collect_projection, _carry_projection,
           _accumulate_by_invariant, _accumulate_invariants, _accumulate_gram_of_input,
           _picked_steps, _chained_projection, _same_product_summed_and_collected,
           _collect_along_columns, _nonfinite_rows_skipped, _nan_accumulator]


@pytest.mark.parametrize("body", FORWARD, ids=lambda f: f.__name__.strip("_"))
def test_forward_loops_with_hoisted_products_match_eager_at_every_length(body):
    """Three lengths make one llvm kernel for every length; then short (1..4, down to the
    loop's bounds) and long lengths never traced."""
    def make():
        w, u, v = _param(4, 4, seed=1), _param(4, 4, seed=2), _param(4, 3, seed=3)
        return (lambda x: body(x, w, u, v)), [w, u, v], None
    lengths = [6, 7, 9, 3, 4, 5, 64, 8]
    if body is not _nonfinite_rows_skipped:
        lengths += [1, 2]
    calls = []
    for i, n in enumerate(lengths):
        x = np.random.default_rng(i).standard_normal((n, 2, 4)).astype(np.float32)
        if body is _nonfinite_rows_skipped:
            x[0], x[-1] = np.inf, np.nan
        calls.append((hn.tensor(x),))
    traced = _twin(make, calls, no_grad=True)
    if body not in (_collect_along_columns,):
        assert _hoisted(traced)


# ---- training steps: forward and backward loops rewritten, optimizer state ------------


def _step_maker(loss_of, opt_cls=hn.optim.Adam, lr=0.01, dtype=np.float32):
    def make():
        w = _param(4, 4, seed=1, dtype=dtype)
        u = _param(4, 4, seed=2, dtype=dtype)
        v = _param(4, 3, seed=3, dtype=dtype)
        opt = opt_cls([w, u, v], lr=lr)

        def step(x):
            opt.zero_grad()
            loss = loss_of(x, w, u, v)
            loss.backward()
            opt.step()
            return loss.detach()
        return step, [w, u, v], opt
    return make


def _reversed_read_loss(x, w, u, v):
    h, n, outs = x[0] * 0, x.shape[0], []
    for t in range(n):
        h = (x[n - 1 - t] @ w + h @ u).tanh()
        outs.append(h @ v)
    y = hn.stack(outs[::-1])
    return (y * y).mean() + outs[-1].sum() * 0.1 + outs[0].sum() * 0.2


def _gram_accumulator_loss(x, w, u, v):
    h, acc = hn.zeros(2, 4), hn.full((4, 4), 0.5)
    for t in range(1, x.shape[0]):  # (skips the first step)
        h = (x[t] @ w.t() + h @ u).tanh()
        acc = h.t() @ x[t] + acc
    return (acc * w).sum() * 0.1 + (acc.t() @ acc).mean() * 0.01 + (h @ v).var()


def _rows_of_a_4d_input_loss(x, w, u, v):  # x (T, 2, 3, 4): x[t] regrouped into rows
    h, outs = hn.zeros(6, 4), []
    for t in range(x.shape[0]):
        h = (x[t].reshape(6, 4) @ w + h @ u).tanh()
        outs.append((h @ v).reshape(2, 3, 3))
    return (hn.stack(outs) ** 2).mean()


@pytest.mark.parametrize("loss_of, shape", [
    (_reversed_read_loss, (2, 4)),
    (_gram_accumulator_loss, (2, 4)),
    (_rows_of_a_4d_input_loss, (2, 3, 4)),
], ids=["reversed_read", "gram_accumulator", "rows_of_4d_input"])
def test_training_steps_with_hoisted_products_keep_eager_state(loss_of, shape):
    calls = [(_x(n, *shape, seed=i),) for i, n in enumerate([5, 6, 7, 3, 12, 5])]
    traced = _twin(_step_maker(loss_of), calls)
    assert _hoisted(traced)


def test_a_float64_training_step_keeps_eager_state():
    calls = [(_x(n, 2, 4, seed=i, dtype=np.float64),) for i, n in enumerate([5, 6, 7, 3, 20])]
    _twin(_step_maker(lambda x, w, u, v: _reversed_read_loss(x, w, u, v) + x.mean() * 0,
                      dtype=np.float64), calls)


def test_a_list_argument_loop_with_an_accumulated_product_keeps_eager_state():
    def loss_of(xl, w, u, v):
        h, acc = hn.zeros(2, 4), hn.zeros(4, 3)
        for x in xl:
            h = (x @ w + h @ u).tanh()
            acc = acc + h.t() @ (h @ v)
        return (acc ** 2).mean() + (h @ v).mean()
    calls = [([_x(2, 4, seed=10 * i + k) for k in range(n)],)
             for i, n in enumerate([5, 6, 7, 2, 3, 30])]
    _twin(_step_maker(loss_of, hn.optim.SGD), calls)


def test_a_bidirectional_batch_first_lstm_trains_as_eagerly():
    def make():
        hn.manual_seed(5)
        rnn = nn.LSTM(3, 4, 2, bidirectional=True, batch_first=True)
        head = nn.Linear(8, 2)
        params = list(rnn.parameters()) + list(head.parameters())
        opt = hn.optim.Adam(params, lr=0.01)

        def step(x):
            opt.zero_grad()
            out, _ = rnn(x)
            loss = (head(out) ** 2).mean()
            loss.backward()
            opt.step()
            return loss.detach(), out.detach()
        return step, params, opt
    calls = [(_x(2, n, 3, seed=i),) for i, n in enumerate([5, 5, 6, 2, 9])]
    _twin(make, calls)


def test_a_traced_forward_with_an_eager_backward_gives_eagers_gradients():
    def make():
        w, u, v = _param(4, 4, seed=1), _param(4, 4, seed=2), _param(4, 3, seed=3)

        def fwd(x):
            h, outs = x[0] * 0, []
            for t in range(x.shape[0]):
                h = (x[t] @ w + h @ u).tanh()
                outs.append(h @ v)
            return hn.stack(outs)
        return fwd, [w, u, v]
    fa, pa = make()
    fb, pb = make()
    traced = hn.trace(fa)
    for i, n in enumerate([5, 6, 7, 5, 1, 2, 30]):
        x = _x(n, 2, 4, seed=i)
        for p in pa + pb:
            p.grad = None
        ya, yb = traced(x), fb(x)
        _close(_np(ya), _np(yb), f"forward at {n}")
        ((ya ** 2).mean() + ya[-1].sum()).backward()
        ((yb ** 2).mean() + yb[-1].sum()).backward()
        for p, q in zip(pa, pb):
            _close(_np(p.grad), _np(q.grad), f"gradient at {n}")


@pytest.mark.parametrize("tail, symbolic", [
    (lambda y, n: y.mean() + y.var(), True),
    # (n + 1 counts nothing in the graph: no witness, a kernel per length, eager's values)
    (lambda y, n: y.mean() + y.var() + y.sum() / (n + 1), False),
], ids=["mean_var", "with_n_plus_1"])
def test_means_counted_over_the_length_match_eager_at_unseen_lengths(tail, symbolic):
    """Counts that are truly affine in the length (mean, unbiased var's n - 1) computed
    from n by the one kernel: every length agrees, short and long. A float that no count
    of the graph witnesses keeps the lengths apart, on llvm and on numba (whose split
    kernels' constants once escaped its comparison of code: a wrong loss at call 6)."""
    def loss_of(x, w, u, v):
        h, outs = hn.zeros(2, 4), []
        n = x.shape[0]
        for t in range(n):
            h = (x[t] @ w + h @ u).tanh()
            outs.append(h @ v)
        return tail(hn.stack(outs), n)
    calls = [(_x(n, 2, 4, seed=i),) for i, n in enumerate([6, 7, 9, 2, 3, 40, 6])]
    traced = _twin(_step_maker(loss_of), calls)
    assert any(e.symbolic for e in traced.specializations.values()) == symbolic


# ---- constant folding: uniform folds as a broadcast scalar ----------------------------


def _scalar(value, *shape):
    """A 0-d constant broadcast: what is folded from it is uniform at every size."""
    return hn.tensor(value).expand(*shape)


def _folds(x):
    c = _scalar(1.0, 3, 4) * 2.0         # uniform float
    m = _scalar(1.0, 3, 4) > 0           # uniform bool
    i = _scalar(3, 4) * 0                # uniform int, used as an index
    nan = _scalar(float("nan"), 3, 4) * 1.0
    nz = _scalar(0.0, 3, 4) * -1.0       # uniform -0.0 (not the same bits as 0.0)
    mixed = hn.tensor(np.array([0.0, -0.0, 0.0, 0.0], np.float32)) * 1.0  # not uniform
    return (x * c + hn.where(m, x, -x), x.index_select(1, i), x + nan,
            1.0 / (nz + x * 0), 1.0 / (mixed + x * 0), c, nz)


def _same_bits(got, want, what):
    for k, (g, w) in enumerate(zip(_flat(got), _flat(want))):
        a, b = np.asarray(_np(g)), np.asarray(_np(w))
        assert a.dtype == b.dtype and a.shape == b.shape, (what, k)
        assert np.array_equal(a, b, equal_nan=True), (what, k, a, b)
        assert np.array_equal(np.signbit(a), np.signbit(b)), (what, k, a, b)


@pytest.mark.parametrize("backend", ["llvm", "numba"])
def test_uniform_folds_keep_their_bits_dtypes_and_fresh_results(backend):
    traced = hn.trace(_folds, backend=backend)
    for i in range(4):
        x = _x(3, 4, seed=i)
        with hn.no_grad():
            got, want = traced(x), _folds(x)
        _same_bits(got, want, f"call {i}")
        got[5][0, 0] = 7.0  # (a returned broadcast must be a fresh array of its own)
        got[6].add_(1.0)
    graph = next(iter(traced.specializations.values())).traces[0].result.optimized
    assert any(n.op == "expand" and n.inputs[0].op == "const" for n in graph.nodes)
    assert "expand" in str(hn.explain(traced, _x(3, 4)))


def test_exports_of_uniform_folds_compute_eagers_values():
    x = _x(3, 4, seed=9)
    want = _folds(x)
    _same_bits(loads(hn.export(_folds, x))(x), want, "json")
    json.loads(hn.export(_folds, x))
    assert "expand" in hn.export(_folds, x, format="dot")
    import onnx
    from onnx.reference import ReferenceEvaluator
    model = onnx.load_from_string(hn.export(_folds, x, format="onnx"))
    onnx.checker.check_model(model)
    with np.errstate(all="ignore"):
        res = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x.numpy()})
    _same_bits(list(res[:len(want)]), want, "onnx")


# ---- bugs ---------------------------------------------------------------------------------


def _rnn_then(tail):
    hn.manual_seed(3)
    cell = nn.RNNCell(4, 5)

    def f(xs):
        n = xs.shape[0]
        h, outs = hn.zeros(3, 5), []
        for t in range(n):
            h = cell(xs[t], h)
            outs.append(h)
        return tail(hn.stack(outs), n)
    return f


def _compare_lengths(f, lengths, backend="llvm"):
    traced = hn.trace(f, backend=backend)
    rng = np.random.default_rng(0)
    with hn.no_grad():
        for steps in lengths:
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            got, want = traced(xs).numpy(), f(xs).numpy()
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{steps} steps")
            assert np.array_equal(np.signbit(got), np.signbit(want)), f"{steps} steps"


@pytest.mark.parametrize("name, tail, lengths", [
    # a window capped at 8: affine (n) at the traced lengths 4, 5, 6; 8 from 8 on
    ("/ min(n, 8)", lambda y, n: y.sum() / min(n, 8), (4, 5, 6, 20, 30)),
    # docs/jit.md's own example of "no count", traced where it happens to be affine
    ("* float(n % 7)", lambda y, n: y.sum() * float(n % 7), (3, 4, 5, 9, 14)),
    # pairs of steps: 2 * (n // 2) is n at even lengths
    ("/ (2 * (n // 2))", lambda y, n: y.sum() / float(2 * (n // 2)), (4, 6, 8, 5, 7)),
    # a traced length again: its -0.0 comes back as sitofp's +0.0
    ("/ -float(n - 5)", lambda y, n: y.sum(0) / -float(n - 5), (5, 6, 7, 5)),
], ids=["min_n_8", "n_mod_7", "even_n", "negative_zero"])
def test_a_float_the_length_computes_is_no_count_without_a_witness(name, tail, lengths):
    """Found in review of f8e596e: a 0-d float constant whose values at the three traced
    lengths were whole numbers (or their reciprocals) on one affine function of n was
    computed from n at every length, though Python computed min(n, 8) or n % 7. Now a
    count needs a witness in the graph (llvm_sym `_count`: the elements of a sum beside
    it, or of what it multiplies or is broadcast into), and these keep eager's values."""
    _compare_lengths(_rnn_then(tail), lengths)


@pytest.mark.parametrize("backend, lengths", [("llvm", (4, 5, 6, 20, 9)),
                                               ("numba", (4, 5, 20, 9))])
def test_an_array_uniform_only_at_the_traced_lengths_stays_an_array(
        backend, lengths):
    """Found in review of f8e596e: a mask computed from the length, (arange(n) < 8) * 2,
    folds to one value at n <= 8; it became expand(2.0) with the length's size, and one
    kernel used 2.0 for every step at every length, where eager has 0 from step 8 on.
    Only folds of one-element or broadcast constants take the broadcast form now."""
    def tail(y, n):
        mask = (hn.arange(n) < 8).float().reshape(n, 1, 1) * 2.0
        return (y * mask).sum(0)
    _compare_lengths(_rnn_then(tail), lengths, backend)


def test_a_gradient_seed_computed_from_the_length_keeps_numba_per_length():
    """Found in review of f8e596e: the loss y.var() + y.sum() * 1e-3 * n over a rerolled
    loop, with backward(). llvm refuses one kernel (0.001 * n is no count) and numba's
    size-generic code generalized: its split kernels' constants (K0, K1...) were named
    only in comments, so code that read 0.006 and 0.007 compared equal
    (runtime.pipeline.program_key now keys each kernel with its globals), and the loss
    and gradients were wrong at every other length."""
    def make():
        w, u, v = _param(4, 4, seed=1), _param(4, 4, seed=2), _param(4, 3, seed=3)

        def step(x):
            for p in (w, u, v):
                p.grad = None
            h, outs = hn.zeros(2, 4), []
            n = x.shape[0]
            for t in range(n):
                h = (x[t] @ w + h @ u).tanh()
                outs.append(h @ v)
            y = hn.stack(outs)
            loss = y.var() + y.sum() * 1e-3 * float(n)
            loss.backward()
            return loss.detach()
        return step, [w, u, v], None
    _twin(make, [(_x(n, 2, 4, seed=i),) for i, n in enumerate([6, 7, 9, 12])])
