"""Fused eager ops (hybridnet.fused): F.linear, F.relu and F.cross_entropy run as one tape
node with a hand-written backward when nothing records primitives. The oracle is the
composite they replace (`fused.composites()`), value for value and gradient for gradient,
including higher-order gradients, saved-value checks and the errors."""

import numpy as np
import pytest

import hybridnet as hn
import hybridnet.nn.functional as F
from hybridnet import fused
from hybridnet.cli_bench import training_step

TOL = {np.float32: dict(rtol=2e-6, atol=1e-6), np.float64: dict(rtol=1e-13, atol=1e-14)}


def _run(fn, arrays, grad_mask, create_graph=False):
    """fn on fresh tensors of `arrays` (those with grad_mask True require grad): the
    result, the grads of sum(result * weights), and with create_graph, the grads of the
    squared norm of those grads."""
    ts = [hn.tensor(a, requires_grad=m) if isinstance(a, np.ndarray) and a.dtype.kind == "f"
          else hn.tensor(a) for a, m in zip(arrays, grad_mask)]
    out = fn(*ts)
    wanted = [t for t, m in zip(ts, grad_mask) if m]
    weights = np.linspace(-1.5, 2.0, out.numel()).reshape(out.shape).astype(
        out.detach().numpy().dtype)
    loss = (out * hn.tensor(weights)).sum()
    grads = hn.grad(loss, wanted, create_graph=create_graph)
    second = None
    if create_graph:
        total = sum((g * g).sum() for g in grads)
        second = [g.numpy() for g in hn.grad(total, wanted, allow_unused=True)
                  if g is not None]
    return out.detach().numpy(), [g.detach().numpy() for g in grads], second, out


def _compare(fn, arrays, grad_mask, name, create_graph=False):
    dt = next(a.dtype.type for a in arrays if isinstance(a, np.ndarray) and a.dtype.kind == "f")
    got = _run(fn, arrays, grad_mask, create_graph)
    with fused.composites():
        want = _run(fn, arrays, grad_mask, create_graph)
    assert got[3].grad_fn.name() == name and want[3].grad_fn.name() != name
    np.testing.assert_allclose(got[0], want[0], **TOL[dt])
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, **TOL[dt])
    if create_graph:
        assert len(got[2]) == len(want[2])
        for g, w in zip(got[2], want[2]):
            np.testing.assert_allclose(g, w, **TOL[dt])


def _arrays(rng, dtype, *shapes):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("x_shape", [(5, 7), (3, 4, 7), (1, 7)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mask", [(True, True, True), (False, True, True), (True, False, False)])
def test_linear_matches_the_composite(dtype, x_shape, bias, mask):
    rng = np.random.default_rng(1)
    arrays = _arrays(rng, dtype, x_shape, (6, 7), (6,))[:3 if bias else 2]
    mask = mask[:len(arrays)]
    _compare(lambda *t: F.linear(*t), arrays, mask, "linear")


def test_linear_second_order_matches_the_composite():
    rng = np.random.default_rng(2)
    arrays = _arrays(rng, np.float64, (4, 5), (3, 5), (3,))
    _compare(lambda *t: F.linear(*t), arrays, (True, True, True), "linear", create_graph=True)


def test_linear_weight_gradient_is_laid_out_as_the_weight():
    rng = np.random.default_rng(3)
    lin = hn.nn.Linear(7, 6)
    lin(hn.tensor(rng.standard_normal((5, 7)).astype(np.float32))).sum().backward()
    assert lin.weight.grad.numpy().flags.c_contiguous


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_matches_the_composite_on_edge_values(dtype):
    x = np.array([[-2.0, -0.0, 0.0, 1e-30, np.nan, np.inf, -np.inf, 3.5]], dtype)
    _compare(lambda t: F.relu(t), [x], (True,), "relu")
    got = F.relu(hn.tensor(x)).numpy()
    assert not np.signbit(got).any() and (got == [[0, 0, 0, x[0, 3], 0, np.inf, 0, 3.5]]).all()


def test_relu_backward_masks_infinite_gradients_as_where_does():
    x = hn.tensor(np.array([-1.0, 2.0, -3.0]), requires_grad=True)
    (g,) = hn.grad(F.relu(x), [x], grad_outputs=[hn.tensor([np.inf, np.inf, np.nan])])
    np.testing.assert_array_equal(g.numpy(), [0.0, np.inf, 0.0])


def test_relu_second_order_matches_the_composite():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4))
    got = _run(lambda t: F.relu(t) * t, [x], (True,), create_graph=True)
    with fused.composites():
        want = _run(lambda t: F.relu(t) * t, [x], (True,), create_graph=True)
    np.testing.assert_allclose(got[2][0], want[2][0], rtol=1e-13)


CE_CASES = {
    "mean": dict(reduction="mean"),
    "sum": dict(reduction="sum"),
    "none": dict(reduction="none"),
    "ignored -100": dict(reduction="mean", ignore=-100),
    "ignored class 2": dict(reduction="mean", ignore=2, ignore_index=2),
    "ignored, none": dict(reduction="none", ignore=-100),
    "ignored, sum": dict(reduction="sum", ignore=-7, ignore_index=-7),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", list(CE_CASES))
def test_cross_entropy_matches_the_composite(dtype, case):
    spec = dict(CE_CASES[case])
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((9, 5)) * 3).astype(dtype)
    x[0, 1] = 80.0  # a large logit (the max shift matters)
    t = rng.integers(0, 5, 9)
    if "ignore" in spec:
        t[[1, 4]] = spec.pop("ignore")
    kw = {k: v for k, v in spec.items() if k in ("reduction", "ignore_index")}
    _compare(lambda a, b: F.cross_entropy(a, b, **kw), [x, t], (True, False), "cross_entropy")


def test_cross_entropy_second_order_matches_the_composite():
    rng = np.random.default_rng(6)
    x, t = rng.standard_normal((6, 4)), rng.integers(0, 4, 6)
    t[2] = -100
    _compare(lambda a, b: F.cross_entropy(a, b), [x, t], (True, False), "cross_entropy",
             create_graph=True)


def test_cross_entropy_every_target_ignored_is_nan_as_the_composite():
    x = hn.tensor(np.ones((2, 3)), requires_grad=True)
    t = hn.tensor([-100, -100])
    loss = F.cross_entropy(x, t)
    with fused.composites():
        want = F.cross_entropy(x, t)
    assert np.isnan(loss.item()) and np.isnan(want.item())


def test_cross_entropy_rows_with_infinite_logits_match_the_composite():
    x = np.array([[np.inf, 0.0, 1.0], [-np.inf, 0.0, 1.0], [2.0, 1.0, 0.0]])
    t = np.array([0, 0, 2])
    got = _run(lambda a, b: F.cross_entropy(a, b, reduction="none"), [x, t], (True, False))
    with fused.composites():
        want = _run(lambda a, b: F.cross_entropy(a, b, reduction="none"), [x, t],
                    (True, False))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1][0], want[1][0], rtol=1e-13)


def test_cross_entropy_out_of_range_target_raises_as_the_composite():
    x = hn.tensor(np.zeros((3, 4)), requires_grad=True)
    t = hn.tensor([0, 7, 1])
    with pytest.raises(IndexError, match="nll_loss: target 7 is out of bounds for 4 classes"):
        F.cross_entropy(x, t)
    with fused.composites(), pytest.raises(IndexError,
                                           match="nll_loss: target 7 is out of bounds for 4"):
        F.cross_entropy(x, t)


@pytest.mark.parametrize("call", [
    lambda x, t: F.cross_entropy(x[0], t[0]),                   # 1-D input
    lambda x, t: F.cross_entropy(x, t, weight=hn.ones(4)),      # class weights
    lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
    lambda x, t: F.cross_entropy(x.reshape(3, 4, 1), t.reshape(3, 1)),  # (N, C, d)
])
def test_cases_the_fused_op_does_not_cover_take_the_composite(call):
    x = hn.tensor(np.arange(12.0).reshape(3, 4) / 7, requires_grad=True)
    t = hn.tensor([0, 3, 1])
    out = call(x, t)
    assert out.grad_fn.name() != "cross_entropy"
    out.sum().backward()
    assert x.grad is not None


def test_traced_and_recorded_calls_see_the_composite():
    lin = hn.nn.Linear(4, 3)
    x = hn.randn(2, 4)
    with hn.record() as rec:
        F.cross_entropy(F.relu(lin(x)), hn.tensor([0, 2]))
    ops = {n.op for n in rec.graph.nodes}
    assert "matmul" in ops and "fused" not in ops
    assert not {"linear", "relu", "cross_entropy"} & ops


def test_no_grad_records_nothing():
    lin = hn.nn.Linear(4, 3)
    with hn.no_grad():
        out = F.relu(lin(hn.randn(2, 4)))
    assert out.grad_fn is None and not out.requires_grad


def test_an_in_place_update_of_a_saved_value_makes_backward_raise():
    w = hn.randn(3, 4, requires_grad=True)
    x = hn.randn(2, 4)
    out = F.linear(x, w)
    x.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        out.sum().backward()
    y = F.relu(hn.randn(5, requires_grad=True) * 1.0)
    y.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.sum().backward()


def test_backward_twice_needs_retain_graph():
    w = hn.randn(3, 4, requires_grad=True)
    loss = F.cross_entropy(F.linear(hn.randn(2, 4), w), hn.tensor([1, 2]))
    loss.backward(retain_graph=True)
    first = w.grad.numpy().copy()
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * first, rtol=1e-6)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_a_traced_training_step_matches_the_fused_eager_step():
    """The traced step records the composite, the eager twin runs fused: same state."""
    def make():
        hn.manual_seed(0)
        model = hn.nn.Sequential(hn.nn.Linear(6, 5), hn.nn.ReLU(), hn.nn.Linear(5, 3))
        return model, hn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    (m1, o1), (m2, o2) = make(), make()
    step, traced = training_step(m1, o1), hn.trace(training_step(m2, o2))
    rng = np.random.default_rng(7)
    for _ in range(5):
        x = hn.tensor(rng.standard_normal((4, 6)).astype(np.float32))
        y = hn.tensor(rng.integers(0, 3, 4))
        a, b = step(x, y), traced(x, y)
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5)
    for p, q in zip(m1.parameters(), m2.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert traced.stats.compiled_calls >= 2


# ---- the tape read as a graph (hn.graph_of) holds the composites -------------------------


def _eager_mlp_loss(rng):
    model = hn.nn.Sequential(hn.nn.Linear(5, 4), hn.nn.ReLU(), hn.nn.Linear(4, 3))
    x = hn.tensor(rng.standard_normal((6, 5)))
    y = hn.tensor(rng.integers(0, 3, 6))
    return model, x, F.cross_entropy(model(x), y)


def test_graph_of_a_fused_tape_holds_registry_ops_and_reruns():
    from compiler.ops import REGISTRY
    model, x, loss = _eager_mlp_loss(np.random.default_rng(8))
    assert loss.grad_fn.name() == "cross_entropy"
    graph = hn.graph_of(loss)
    assert all(n.op in REGISTRY for n in graph.nodes)
    assert {"matmul", "where", "exp"} <= {n.op for n in graph.nodes}
    values = {id(n): n.value for n in graph.inputs}
    (rerun,) = graph.run(*[values[id(n)] for n in graph.inputs])
    np.testing.assert_allclose(rerun, loss.item(), rtol=1e-12)


def test_backward_after_graph_of_gives_the_fused_gradients():
    rng = np.random.default_rng(9)
    model, x, loss = _eager_mlp_loss(rng)
    loss.backward(retain_graph=True)
    fused_grads = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    hn.graph_of(loss)  # rewires the tape through the composites
    loss.backward()
    for p, g in zip(model.parameters(), fused_grads):
        np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-12, atol=1e-15)


def test_graph_of_a_freed_or_modified_fused_tape_raises():
    _, _, loss = _eager_mlp_loss(np.random.default_rng(10))
    loss.backward()
    with pytest.raises(RuntimeError, match="freed by backward"):
        hn.graph_of(loss)
    w = hn.randn(3, 4, requires_grad=True)
    x = hn.randn(2, 4)
    out = F.linear(x, w)
    x.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        hn.graph_of(out)


# ---- the fused LSTM step (hybridnet/nn/fused_lstm.py) ------------------------------------


def _lstm_run(dtype, bias, seq, create_graph=False, bidirectional=False, state=False):
    hn.manual_seed(11)
    lstm = hn.nn.LSTM(5, 4, num_layers=2, bias=bias, dtype=dtype, bidirectional=bidirectional)
    rng = np.random.default_rng(12)
    x = hn.tensor(rng.standard_normal((seq, 3, 5)).astype(dtype), requires_grad=True)
    dirs = 2 if bidirectional else 1
    hx = None
    if state:
        hx = tuple(hn.tensor(rng.standard_normal((2 * dirs, 3, 4)).astype(dtype),
                             requires_grad=True) for _ in range(2))
    out, (h, c) = lstm(x, hx)
    assert ("lstm_layer" in {n.op for n in _history(out)}) == fused.enabled()
    w = hn.tensor(np.linspace(-1, 1, out.numel()).reshape(out.shape).astype(dtype))
    loss = (out * w).sum() + (h * h).sum() + c.sum()
    params = [x, *(hx or ()), *lstm.parameters()]
    grads = hn.grad(loss, params, create_graph=create_graph)
    second = None
    if create_graph:
        second = hn.grad(sum((g * g).sum() for g in grads[:3]), params[:3])
    return out, [g.detach().numpy() for g in grads], second


def _history(t):
    seen, stack, found = set(), [t.grad_fn], []
    while stack:
        n = stack.pop()
        if id(n) not in seen:
            seen.add(id(n))
            found.append(n)
            stack.extend(n.inputs)
    return found


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", ["plain", "bidirectional", "given state", "one step"])
def test_lstm_fused_layers_match_the_composite(dtype, bias, shape):
    kw = dict(bidirectional=shape == "bidirectional", state=shape == "given state")
    seq = 1 if shape == "one step" else 6
    out, grads, _ = _lstm_run(dtype, bias, seq, **kw)
    assert out.grad_fn is not None
    with fused.composites():
        want_out, want, _ = _lstm_run(dtype, bias, seq, **kw)
    np.testing.assert_allclose(out.detach().numpy(), want_out.detach().numpy(),
                               **TOL[dtype])
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w, rtol=1e-5 if dtype == np.float32 else 1e-12,
                                   atol=1e-6 if dtype == np.float32 else 1e-14)


def test_lstm_cell_step_is_one_fused_node_and_second_order_replays_the_composite():
    cell = hn.nn.LSTMCell(3, 2, dtype=np.float64)
    x = hn.randn(4, 3, dtype=hn.float64, requires_grad=True)
    h, c = cell(x)
    assert h.grad_fn is not None and c.grad_fn is not None
    _, _, second = _lstm_run(np.float64, True, 3, create_graph=True)
    with fused.composites():
        _, _, want = _lstm_run(np.float64, True, 3, create_graph=True)
    for g, w in zip(second, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-11, atol=1e-13)


def test_graph_of_an_lstm_tape_holds_the_composite():
    from compiler.ops import REGISTRY
    lstm = hn.nn.LSTM(3, 2, dtype=np.float64)
    lstm_out, _ = lstm(hn.randn(4, 2, 3, dtype=hn.float64))
    assert lstm_out.grad_fn is not None
    graph = hn.graph_of(lstm_out)
    assert all(n.op in REGISTRY for n in graph.nodes)
    assert {"sigmoid", "tanh", "matmul"} <= {n.op for n in graph.nodes}
    values = {id(n): n.value for n in graph.inputs}
    (rerun,) = graph.run(*[values[id(n)] for n in graph.inputs])
    np.testing.assert_allclose(rerun, lstm_out.detach().numpy(), rtol=1e-12)


# ---- Adam's update in NumPy (hybridnet/optim/adam.py) ------------------------------------


def _adam_run(kind, dtype, steps=6, **kw):
    hn.manual_seed(13)
    model = hn.nn.Sequential(hn.nn.Linear(5, 4, dtype=dtype), hn.nn.Tanh(),
                             hn.nn.Linear(4, 3, dtype=dtype))
    opt = getattr(hn.optim, kind)(model.parameters(), lr=0.05, **kw)
    rng = np.random.default_rng(14)
    for k in range(steps):
        x = hn.tensor(rng.standard_normal((6, 5)).astype(dtype))
        opt.zero_grad()
        ((model(x) ** 2).mean()).backward()
        if k == 3:
            for group in opt.param_groups:
                group["lr"] = 0.02
        opt.step()
    state = [{k: (v.numpy().copy() if hasattr(v, "numpy") else v) for k, v in s.items()}
             for s in opt.state.values()]
    return [p.detach().numpy().copy() for p in model.parameters()], state, model, opt


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind,kw", [
    ("Adam", {}), ("Adam", dict(weight_decay=0.1)), ("Adam", dict(amsgrad=True)),
    ("Adam", dict(maximize=True, betas=(0.8, 0.9), eps=1e-6)), ("AdamW", {}),
    ("AdamW", dict(amsgrad=True, weight_decay=0.3))])
def test_adam_numpy_update_is_the_tensor_update_bit_for_bit(dtype, kind, kw, monkeypatch):
    from hybridnet.optim import adam
    calls = []
    fast = adam._fast_update
    monkeypatch.setattr(adam, "_fast_update", lambda *a: calls.append(1) or fast(*a))
    params, state, model, opt = _adam_run(kind, dtype, **kw)
    assert len(calls) == 6 * 4  # (every step of every parameter)
    with fused.composites():
        want_params, want_state, want_model, want_opt = _adam_run(kind, dtype, **kw)
    assert len(calls) == 6 * 4
    for p, w in zip(params, want_params):
        np.testing.assert_array_equal(p, w)
    for s, w in zip(state, want_state):
        assert s.keys() == w.keys()
        for k in s:
            np.testing.assert_array_equal(s[k], w[k])
    from hybridnet.tensor import version_counter
    for a, b in zip([*model.parameters(), *[v for s in opt.state.values() for v in s.values()]],
                    [*want_model.parameters(),
                     *[v for s in want_opt.state.values() for v in s.values()]]):
        assert version_counter(a)[0] == version_counter(b)[0]


def test_adam_state_loaded_with_other_types_takes_the_tensor_update():
    """A state dict whose moments are float64 for float32 parameters (or whose step is
    an int tensor) is updated by the tensor ops, as before: the NumPy path declines."""
    params, _, model, opt = _adam_run("Adam", np.float32, steps=2)
    sd = opt.state_dict()
    for s in sd["state"].values():
        s["exp_avg"] = hn.tensor(s["exp_avg"].numpy().astype(np.float64))
        s["step"] = hn.tensor(np.int64(2))
    opt.load_state_dict(sd)
    from hybridnet.optim import adam
    p = next(iter(model.parameters()))
    assert not adam._fast(p, p, opt.state[p], opt.param_groups[0])
    model(hn.randn(2, 5)).sum().backward()
    opt.step()
    assert all(np.isfinite(q.detach().numpy()).all() for q in model.parameters())
