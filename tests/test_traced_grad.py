"""Gradients through traced calls: a traced call whose inputs or parameters need grad runs
a compiled forward, and `.backward()` / `hn.grad` on anything downstream runs its
compiled backward (one autograd node per call), accumulating `.grad` as eager does.

Table-driven over the primitive and composite cases (every differentiable primitive
twice, on different shapes and layouts), then an MLP, an LSTM over a sequence and a
model with a value-dependent branch; then the call's place in a larger eager graph:
several calls before one backward, unused outputs, retain_graph, create_graph, in-place
updates of saved inputs, and what each call ran (compiled forward and backward).
"""

import numpy as np
import pytest
import test_composites as comp
from oracles import R, flat, is_float, make_inputs, seed_of
from test_trace_ops import EAGER, PRIMS, _bind, fallback_reasons

import hybridnet as hn
import hybridnet.nn.functional as F
from hybridnet import nn

TOL = {np.dtype(np.float32): (2e-5, 2e-6), np.dtype(np.float64): (1e-9, 1e-12)}
GRAD_PRIMS = [c for c in PRIMS if c.grad and c.id not in EAGER]
# compiled forward, but the backward meets size-0 dims (run eagerly, as inference does)
GRAD_EAGER = {"sum-size0": "size-0 dims", "matmul-inner0": "size-0 dims",
              "cat-dim0": "size-0 dims", "sum-size0-dim": "size-0 dims", "cat-0": "size-0 dims"}
GRAD_COMPOSITES = [c for c in comp.CASES if c.grad]


def _leaves(specs, dtype, seed):
    tensors = [hn.from_numpy(a) for a in make_inputs(specs, dtype, seed)
               if isinstance(a, np.ndarray)]
    for t in tensors:
        if is_float(t._data):
            t.requires_grad_()
    return tensors


def _grads_of(fn, tensors, seed):
    """Outputs and the gradients of a seeded loss over them, for the float leaves."""
    outs = [o for o in flat(fn(*tensors)) if o.requires_grad]
    rng = np.random.default_rng(seed)
    loss = sum((o * hn.from_numpy(rng.standard_normal(o.shape).astype(o._data.dtype))).sum()
               for o in outs)
    wrt = [t for t in tensors if t.requires_grad]
    grads = hn.grad(loss, wrt, allow_unused=True) if outs else [None] * len(wrt)
    return [o.detach().numpy().copy() for o in outs], [
        None if g is None else g.numpy().copy() for g in grads]


def _assert_close(got, want, what):
    assert len(got) == len(want), what
    for k, (a, e) in enumerate(zip(got, want)):
        if e is None or a is None:
            assert a is None or not np.any(a), f"{what} {k}: {a} vs {e}"
            continue
        rtol, atol = TOL[np.asarray(e).dtype]
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=f"{what} {k}")


def check_traced_grad(name, fn, specs, dtype=np.float64):
    """Eager gradients == gradients through the compiled call (its second call)."""
    seed = seed_of(name)
    fn = _bind(fn, make_inputs(specs, dtype, seed))
    want_out, want = _grads_of(fn, _leaves(specs, dtype, seed), seed)
    tf = hn.trace(fn)
    _grads_of(tf, _leaves(specs, dtype, seed), seed)  # traces (eager result)
    got_out, got = _grads_of(tf, _leaves(specs, dtype, seed), seed)
    _assert_close(got_out, want_out, f"{name}: output")
    _assert_close(got, want, f"{name}: gradient of input")
    return tf


@pytest.mark.parametrize("case", GRAD_PRIMS, ids=[c.id for c in GRAD_PRIMS])
def test_gradients_through_a_traced_primitive_equal_eager(case):
    tf = check_traced_grad(case.id, case.fn, case.inputs)
    if case.id in GRAD_EAGER:
        assert any(GRAD_EAGER[case.id] in r for r in fallback_reasons(tf))
        return
    assert tf.stats.compiled_calls == 1, (tf.stats, fallback_reasons(tf))
    assert tf.stats.compiled_backwards == 1, tf.stats


@pytest.mark.parametrize("case", GRAD_COMPOSITES, ids=[c.name for c in GRAD_COMPOSITES])
def test_gradients_through_a_traced_composite_equal_eager(case):
    tf = check_traced_grad(case.name, lambda *ts: case.fn(hn, *ts), case.inputs,
                           dtype=np.float32)
    if case.name in GRAD_EAGER:
        assert any(GRAD_EAGER[case.name] in r for r in fallback_reasons(tf))
    elif case.name not in EAGER:
        assert tf.stats.compiled_calls == 1, (tf.stats, fallback_reasons(tf))


# ---- models ------------------------------------------------------------------------------


def _param_grads(model):
    return [None if p.grad is None else p.grad.numpy().copy() for p in model.parameters()]


def _model_check(model, run, n=3):
    """`run(f)` computes a loss with forward `f`; eager grads == traced grads each call."""
    traced = hn.trace(model)
    for i in range(n):
        model.zero_grad()
        want_loss = run(model)
        want_loss.backward()
        want = _param_grads(model)
        model.zero_grad()
        loss = run(traced)
        loss.backward()
        assert abs(loss.item() - want_loss.item()) < 1e-5 * max(1, abs(want_loss.item()))
        _assert_close(_param_grads(model), want, f"call {i}: parameter gradient")
    return traced


def test_an_mlp_forward_compiles_and_its_backward_runs_compiled():
    hn.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
    x, y = hn.randn(8, 12), hn.tensor(np.arange(8) % 4)
    traced = _model_check(model, lambda f: F.cross_entropy(f(x), y))
    assert traced.stats.compiled_calls == 2 and traced.stats.compiled_backwards == 2


class SeqLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(3, 5)
        self.head = nn.Linear(5, 1)

    def forward(self, xs):
        h = c = hn.zeros(xs.shape[1], 5)
        for t in range(xs.shape[0]):
            h, c = self.cell(xs[t], (h, c))
        return self.head(h)


def test_an_lstm_over_a_sequence_gives_eager_gradients():
    hn.manual_seed(1)
    model = SeqLSTM()
    xs, y = hn.randn(6, 4, 3), hn.randn(4, 1)
    traced = _model_check(model, lambda f: F.mse_loss(f(xs), y))
    assert traced.stats.compiled_backwards == 2


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        return self.b(h).tanh() if h.sum() > 0 else (h * 2).sigmoid()


def test_a_value_dependent_branch_gives_eager_gradients_on_both_paths():
    hn.manual_seed(2)
    model = Branchy()
    traced = hn.trace(model)
    for i, sign in enumerate([1, 1, -1, -1, 1, -1]):
        x = hn.randn(3, 4) * 0.1 + sign * 3 * hn.sign(model.a.weight.sum(0)).detach()
        model.zero_grad()
        model(x).sum().backward()
        want = _param_grads(model)
        model.zero_grad()
        traced(x).sum().backward()
        _assert_close(_param_grads(model), want, f"call {i}")
    assert traced.stats.compiled_backwards >= 2, traced.stats


# ---- the call inside a larger eager graph -------------------------------------------------


def _square_sum(x, w):
    return (x @ w).tanh(), (x * x).sum()


def _setup(seed=3):
    rng = np.random.default_rng(seed)
    x = hn.from_numpy(rng.standard_normal((4, 3)))
    w = hn.tensor(rng.standard_normal((3, 2)), requires_grad=True)
    return x, w


def _both(loss_of):
    """Eager and traced (third call: compiled) gradients of w and of x's source z."""
    results = []
    for fn in (_square_sum, hn.trace(_square_sum)):
        for _ in range(3):
            z = hn.tensor(np.linspace(-1, 1, 12).reshape(4, 3), requires_grad=True)
            x, w = _setup()
            loss = loss_of(fn, z * 2 + 1, w)
            loss.backward()
        results.append((w.grad.numpy().copy(), None if z.grad is None else z.grad.numpy()))
    return results, fn


def test_a_traced_call_inside_a_larger_eager_graph():
    results, tf = _both(lambda f, x, w: (f(x, w)[0] * 3).sum() + f(x, w)[1])
    (we, ze), (wt, zt) = results
    assert tf.stats.compiled_backwards >= 2, tf.stats
    np.testing.assert_allclose(wt, we, rtol=1e-10)
    np.testing.assert_allclose(zt, ze, rtol=1e-10)


def test_several_calls_before_one_backward_and_unused_outputs():
    def loss_of(f, x, w):
        a, _ = f(x, w)  # second output unused
        b, s = f(x * 0.5, w)
        return a.sum() + (b * b).sum() + s

    (we, ze), (wt, zt) = _both(loss_of)[0]
    np.testing.assert_allclose(wt, we, rtol=1e-10)
    np.testing.assert_allclose(zt, ze, rtol=1e-10)


def test_backward_counts_and_grad_fn():
    tf = hn.trace(_square_sum)
    x, w = _setup()
    for _ in range(2):
        tf(x, w)
    a, s = tf(x, w)
    assert a.requires_grad and a.grad_fn is not None and not s.requires_grad
    a.sum().backward()
    assert tf.stats.compiled_backwards == 1 and tf.stats.compiled_calls == 2


def test_a_second_backward_raises_as_eager_and_retain_graph_allows_it():
    tf = hn.trace(_square_sum)
    x, w = _setup()
    tf(x, w)
    a, _ = tf(x, w)
    loss = a.sum()
    loss.backward(retain_graph=True)
    loss.backward()
    w_twice = w.grad.numpy().copy()
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()
    w.grad = None
    a2, _ = _square_sum(x, w)
    a2.sum().backward()
    np.testing.assert_allclose(w_twice, 2 * w.grad.numpy(), rtol=1e-12)


def test_an_in_place_update_of_a_saved_input_raises_as_eager():
    tf = hn.trace(_square_sum)
    x, w = _setup()
    tf(x, w)
    a, _ = tf(x, w)
    with hn.no_grad():
        x.mul_(2)  # x is read by the backward (the gradient of x @ w)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        a.sum().backward()


def test_a_traced_layer_keeps_its_weights_by_reference_not_copied_per_call():
    """The backward reads the weights (the gradient of x @ w.t() needs w): the call keeps
    the caller's array, version-checked, instead of a copy made by the forward kernel;
    gradients are eager's, and a weight updated in place before backward() raises."""
    hn.manual_seed(0)
    layer = nn.Linear(6, 5)
    x = hn.randn(4, 6, requires_grad=True)
    traced = hn.trace(layer)
    for _ in range(2):
        out = traced(x)
    saved = out.grad_fn.inputs[0].value if hasattr(out.grad_fn, "inputs") else None
    assert saved is not None and any(a is layer.weight._data for a in saved)
    spec = next(iter(traced.specializations.values()))
    forward = spec.traces[0].result.optimized
    assert not any(o.op == "input" for o in forward.outputs)  # (no output copies an input)
    out.sum().backward()
    want_w, want_x = layer.weight.grad.numpy().copy(), x.grad.numpy().copy()
    layer.zero_grad()
    x.grad = None
    layer(x).sum().backward()
    np.testing.assert_allclose(want_w, layer.weight.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(want_x, x.grad.numpy(), rtol=1e-6)
    out = traced(x)
    with hn.no_grad():
        layer.weight.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        out.sum().backward()


def test_hn_grad_through_a_traced_call():
    tf = hn.trace(_square_sum)
    x, w = _setup()
    tf(x, w)
    a, _ = tf(x, w)
    (g,) = hn.grad((a * a).sum(), [w])
    a2, _ = _square_sum(x, w)
    (want,) = hn.grad((a2 * a2).sum(), [w])
    np.testing.assert_allclose(g.numpy(), want.numpy(), rtol=1e-10)
    assert w.grad is None


def test_create_graph_through_a_traced_call_gives_eager_second_derivatives():
    def f(w):
        return (w * w * w).sum()

    tf = hn.trace(f)
    w = hn.tensor([0.5, -1.0, 2.0], requires_grad=True)
    tf(w)
    (g,) = hn.grad(tf(w), [w], create_graph=True)
    (gg,) = hn.grad(g.sum(), [w])
    np.testing.assert_allclose(g.detach().numpy(), 3 * w.detach().numpy() ** 2, rtol=1e-6)
    np.testing.assert_allclose(gg.numpy(), 6 * w.detach().numpy(), rtol=1e-6)
    assert any("create_graph" in r for r in fallback_reasons(tf))


def test_inference_under_no_grad_still_returns_plain_tensors():
    tf = hn.trace(_square_sum)
    x, w = _setup()
    with hn.no_grad():
        tf(x, w)
        a, _ = tf(x, w)
    assert not a.requires_grad and a.grad_fn is None
    assert tf.stats.compiled_calls == 1


def test_explain_shows_the_backward_graph_what_is_saved_and_its_kernels():
    hn.manual_seed(4)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
    report = hn.explain(model, hn.randn(2, 3))
    text = str(report)
    bwd = report.to_dict()["specializations"][0]["traces"][0]["backward"]
    assert "backward graph" in text and "backward kernels" in text
    assert bwd["saved"] and all(" float32[" in s for s in bwd["saved"])
    assert "matmul" in bwd["graph"] and bwd["kernels"]
    with hn.no_grad():
        plain = hn.explain(nn.Sequential(nn.Linear(3, 4)), hn.randn(2, 3))
    assert plain.to_dict()["specializations"][0]["traces"][0]["backward"] is None


# ---- regressions from the adversarial review -----------------------------------------------


def _compiled_third(fn, make_args):
    """Results of eager fn and of the third (compiled) traced call, on fresh args each."""
    tf = hn.trace(fn)
    for _ in range(2):
        tf(*make_args())
    return tf


def test_an_input_no_walked_output_reaches_gets_no_grad():
    def f(x, w):
        return x * 2.0, w * 3.0

    def args():
        return (hn.tensor(np.arange(3.0), requires_grad=True),
                hn.tensor(np.ones(3), requires_grad=True))
    tf = _compiled_third(f, args)
    x, w = args()
    a, _ = tf(x, w)
    a.sum().backward()
    assert w.grad is None and x.grad is not None
    a, _ = tf(*args())
    with pytest.raises(RuntimeError, match="not used"):
        hn.grad(a.sum(), [x, w])
    x, w = args()
    a, _ = tf(x, w)
    assert hn.grad(a.sum(), [x, w], allow_unused=True)[1] is None
    assert tf.stats.compiled_backwards == 3


def test_backward_through_another_output_after_the_first_works_as_eager():
    def f(x, w, c):
        return x.exp(), w * c

    def args():
        return (hn.tensor([0.1, 0.2], requires_grad=True),
                hn.tensor([1.0, 2.0], requires_grad=True), hn.tensor([3.0, 4.0]))
    tf = _compiled_third(f, args)
    x, w, c = args()
    y1, y2 = tf(x, w, c)
    y1.sum().backward()
    y2.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [3.0, 4.0])
    with pytest.raises(RuntimeError, match="second time"):
        y1.sum().backward()


def test_retain_graph_then_create_graph_through_a_traced_call():
    def h(x):
        return (x * x * x).sum()

    tf = _compiled_third(h, lambda: (hn.tensor([1.0, 2.0], requires_grad=True),))
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    y = tf(x)
    y.backward(retain_graph=True)
    (g,) = hn.grad(y, [x], create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), [3.0, 12.0])


def test_a_result_updated_in_place_that_the_backward_reads_raises_as_eager():
    def f(x):
        return x.exp()

    tf = _compiled_third(f, lambda: (hn.tensor([0.1, 0.5], requires_grad=True),))
    y = tf(hn.tensor([0.1, 0.5], requires_grad=True))
    with hn.no_grad():
        y.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.sum().backward()


def test_an_input_updated_in_the_call_after_the_forward_read_it_runs_eagerly():
    def g(x, w):
        y = x * w
        with hn.no_grad():
            w.add_(1.0)
        return y

    tg = hn.trace(g)
    for _ in range(3):
        x, w = hn.tensor([1.0, 1.0], requires_grad=True), hn.tensor([1.0, 2.0],
                                                                     requires_grad=True)
        y = tg(x, w)
        with pytest.raises(RuntimeError, match="modified by an in-place operation"):
            y.sum().backward()
    assert tg.stats.compiled_calls == 0
    assert any("in place" in r or "in-place" in r for r in fallback_reasons(tg))


def test_an_in_place_update_of_a_returned_view_of_a_leaf_raises_as_eager():
    def f(x, w):
        return x.T, x @ w

    def args():
        return hn.tensor(np.ones((2, 3)), requires_grad=True), hn.tensor(np.ones((3, 2)))
    tf = _compiled_third(f, args)
    xt, _ = tf(*args())
    with pytest.raises(RuntimeError, match="in-place update of a view"):
        xt.mul_(2)


@pytest.mark.parametrize("name,fn,shape", [
    ("reshape chain", lambda x: x.reshape(6, 4).reshape(2, 12).exp(), (4, 6)),
    ("transposed product", lambda x: ((x @ x.T).T).tanh(), (3, 4)),
    ("permute chain", lambda x: x.transpose(0, 1).transpose(1, 2).sin() * 2, (2, 3, 4)),
])
def test_forwards_the_simplifier_rebuilds_compile_with_their_backward(name, fn, shape):
    tf = check_traced_grad(name, fn, [R(shape)])
    assert tf.stats.compiled_calls == 1 and tf.stats.compiled_backwards == 1, \
        fallback_reasons(tf)


# ---- regressions from the second review ----------------------------------------------------


@pytest.mark.parametrize("recompute", ["0", "1"])
def test_recompute_never_reads_a_view_of_an_input_the_user_then_changes(recompute, monkeypatch):
    monkeypatch.setenv("HYBRIDNET_RECOMPUTE", recompute)

    def f(x):
        return x.T.exp().sum()

    def args():
        return (hn.tensor(np.linspace(0, 0.5, 6).reshape(2, 3), requires_grad=True),)
    tf = _compiled_third(f, args)
    (x,) = args()
    y = tf(x)
    with hn.no_grad():
        x.mul_(0)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(np.linspace(0, 0.5, 6)).reshape(2, 3),
                               rtol=1e-6)


def test_a_no_grad_block_inside_a_traced_call_is_not_differentiated():
    def f(x, w):
        with hn.no_grad():
            s = (x * x).sum()
        return (w * s).sum() + (x * 0.5).sum()

    def args():
        return (hn.tensor([1.0, -2.0, 3.0], requires_grad=True),
                hn.tensor([0.5, 0.5, 0.5], requires_grad=True))
    tf = _compiled_third(f, args)
    x, w = args()
    tf(x, w).backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.5, 0.5, 0.5])
    assert tf.stats.compiled_backwards == 1


def test_a_changed_result_raises_through_the_other_output_too():
    def f(w):
        r = w.exp()
        return r, (r * 2).sum()

    tf = _compiled_third(f, lambda: (hn.tensor([0.1, 0.2], requires_grad=True),))
    r, loss = tf(hn.tensor([0.1, 0.2], requires_grad=True))
    with hn.no_grad():
        r.mul_(0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        loss.backward()


def test_walks_with_retain_graph_do_not_count_towards_freeing():
    def f(x, w):
        return x * w, (x + w) * 2

    def args():
        return hn.tensor([1.0, 2.0], requires_grad=True), hn.tensor([3.0, 4.0],
                                                                     requires_grad=True)
    tf = _compiled_third(f, args)
    x, w = args()
    y1, y2 = tf(x, w)
    y2.sum().backward(retain_graph=True)
    y1.sum().backward()
    y2.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [1.0 + 4.0, 2.0 + 4.0])


def test_an_in_place_change_of_a_saved_intermediate_inside_the_call_runs_eagerly():
    def f(x, w):
        t = (x @ w).tanh()
        t.add_(1)
        return (t * t).sum()

    def args():
        return hn.tensor(np.ones((2, 3))), hn.tensor(np.full((3, 2), 0.1), requires_grad=True)
    tf = hn.trace(f)
    for _ in range(3):
        loss = tf(*args())
        with pytest.raises(RuntimeError, match="modified by an in-place operation"):
            loss.backward()
    assert tf.stats.compiled_calls == 0


def test_with_the_recompute_policy_on_an_mlp_still_gives_eager_gradients(monkeypatch):
    monkeypatch.setenv("HYBRIDNET_RECOMPUTE", "1")
    hn.manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 8), nn.Tanh(),
                          nn.Linear(8, 3))
    x, y = hn.randn(4, 6), hn.tensor([0, 1, 2, 1])
    traced = _model_check(model, lambda f: F.cross_entropy(f(x), y))
    bwd = traced._hot[0].traces[0].result.backward
    assert bwd.split.recomputed and traced.stats.compiled_backwards == 2


def test_create_graph_replays_a_no_grad_block_without_history():
    def f(w):
        with hn.no_grad():
            s = (w * w).sum()
        return (w * w * w).sum() * s

    tf = _compiled_third(f, lambda: (hn.tensor([0.5, -1.0], requires_grad=True),))
    for fn in (f, tf):
        w = hn.tensor([0.5, -1.0], requires_grad=True)
        (g,) = hn.grad(fn(w), [w], create_graph=True)
        (gg,) = hn.grad(g.sum(), [w])
        if fn is f:
            want = (g.detach().numpy(), gg.numpy())
    np.testing.assert_allclose(g.detach().numpy(), want[0], rtol=1e-6)
    np.testing.assert_allclose(gg.numpy(), want[1], rtol=1e-6)
