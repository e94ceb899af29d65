"""Adversarial review of the fused eager ops (hybridnet/fused.py, hybridnet/nn/fused_lstm.py),
the in-place summing backward (dispatch.SummingEmitter, autodiff._accumulate_window) and the
leaf .grad layout. Oracles: the composite on the same inputs (`fused.composites()`) and
PyTorch (float64). Each test asserts the correct behaviour."""

import contextlib

import numpy as np
import pytest
import torch

import hybridnet as hn
import hybridnet.nn.functional as F
from hybridnet import fused
from hybridnet.cli_bench import training_step

TF = torch.nn.functional
R64 = dict(rtol=1e-10, atol=1e-12)


def _both(fn):
    """fn() fused, then fn() with the composites."""
    got = fn()
    with fused.composites():
        want = fn()
    return got, want


def _assert_same(got, want, **tol):
    tol = tol or R64
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if g is None or w is None:
            assert g is None and w is None
            continue
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), **tol)


def _np(t):
    return None if t is None else t.detach().numpy()


def _ops(t):
    """The op names in t's history."""
    seen, stack, found = set(), [t.grad_fn], set()
    while stack:
        n = stack.pop()
        if n is not None and id(n) not in seen:
            seen.add(id(n))
            found.add(n.op)
            stack.extend(n.inputs)
    return found


# ---- cross_entropy: ignored rows must not take part in the gradient ------------------------

X5 = np.array([[3.0, -1.0, 0.5, 2.0], [0.1, 0.2, -4.0, 1.0], [1.0, 1.0, 1.0, 1.0],
               [-2.0, 5.0, 0.0, 0.0], [0.3, -0.3, 2.2, -1.1]])


def _ce_grad_run(target, upstream=None, create_graph=False, **kw):
    def fn():
        x = hn.tensor(X5, requires_grad=True)
        loss = F.cross_entropy(x, hn.tensor(np.asarray(target)), **kw)
        go = None if upstream is None else [hn.tensor(np.asarray(upstream, np.float64))]
        (g,) = hn.grad(loss, [x], grad_outputs=go, create_graph=create_graph)
        return [_np(loss), _np(g)]
    return fn


@pytest.mark.parametrize("create_graph", [False, True])
def test_ce_mean_with_every_target_ignored_has_a_zero_gradient(create_graph):
    """A padding-only batch: loss 0/0 = nan, but the gradient is 0 (composite, torch); the
    fused backward multiplies g/den = inf by the row weight 0 and returns nan everywhere."""
    got, want = _both(_ce_grad_run([-100] * 5, create_graph=create_graph))
    xt = torch.tensor(X5, requires_grad=True)
    TF.cross_entropy(xt, torch.tensor([-100] * 5)).backward()
    assert np.isnan(got[0]) and np.isnan(want[0])
    np.testing.assert_array_equal(want[1], xt.grad.numpy())  # (the composite agrees with torch)
    np.testing.assert_array_equal(got[1], np.zeros_like(X5))


@pytest.mark.parametrize("reduction,upstream", [
    ("none", [1.0, np.inf, 1.0, 1.0, 1.0]),
    ("none", [1.0, np.nan, 1.0, 1.0, 1.0]),
    ("sum", np.inf),
])
def test_ce_non_finite_upstream_gradient_leaves_ignored_rows_at_zero(reduction, upstream):
    """Row 1 is ignored (-100): its gradient is 0 whatever arrives from above (composite and
    torch); fused computes g * w = inf * 0 = nan for that row."""
    target = [0, -100, 2, 3, 0]
    got, want = _both(_ce_grad_run(target, upstream, reduction=reduction))
    xt = torch.tensor(X5, requires_grad=True)
    out = TF.cross_entropy(xt, torch.tensor(target), reduction=reduction)
    out.backward(torch.tensor(np.asarray(upstream, np.float64)))
    np.testing.assert_array_equal(want[1][1], xt.grad.numpy()[1])
    np.testing.assert_array_equal(got[1][1], np.zeros(4))


def test_traced_step_and_eager_step_agree_on_a_batch_whose_targets_are_all_ignored():
    """Twin state: an SGD step on a padding-only batch leaves the parameters as they were in
    the traced twin (composite: zero gradient); the fused eager twin writes nan into them."""
    def make():
        hn.manual_seed(0)
        model = hn.nn.Linear(4, 3, dtype=np.float64)
        return model, hn.optim.SGD(model.parameters(), lr=0.1)

    (m1, o1), (m2, o2) = make(), make()
    step, traced = training_step(m1, o1), hn.trace(training_step(m2, o2))
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = hn.tensor(rng.standard_normal((5, 4)))
        y = hn.tensor(np.full(5, -100))
        step(x, y), traced(x, y)
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert np.isfinite(q.detach().numpy()).all()
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), **R64)


# ---- cross_entropy: cases that agree (kept as coverage) ------------------------------------


@pytest.mark.parametrize("tdtype,kw,target", [
    (np.int32, dict(), [0, 1, 2, 3, 0]),
    (np.int64, dict(ignore_index=0), [0, 1, 2, 3, 0]),             # names a class
    (np.int32, dict(ignore_index=-1, reduction="sum"), [0, -1, 2, -1, 0]),
    (np.int64, dict(ignore_index=4, reduction="none"), [0, 4, 2, 1, 0]),  # == classes
])
def test_ce_matches_torch_for_target_dtypes_and_ignore_indices(tdtype, kw, target):
    x = hn.tensor(X5, requires_grad=True)
    out = F.cross_entropy(x, hn.tensor(np.asarray(target, tdtype)), **kw)
    assert out.grad_fn.name() == "cross_entropy"
    w = np.linspace(-1, 2, out.numel()).reshape(out.shape)
    (out * hn.tensor(w)).sum().backward()
    xt = torch.tensor(X5, requires_grad=True)
    ot = TF.cross_entropy(xt, torch.tensor(np.asarray(target, np.int64)), **kw)
    (ot * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(_np(out), ot.detach().numpy(), **R64)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), **R64)


def test_ce_on_non_contiguous_logits_and_one_row_matches_torch():
    base = hn.tensor(X5.T.copy(), requires_grad=True)   # (4, 5)
    logits = base.T[1:4]                                 # (3, 4): a transposed strided view
    t = [3, -100, 0]
    loss = F.cross_entropy(logits, hn.tensor(t)) + F.cross_entropy(logits[:1], hn.tensor([2]))
    loss.backward()
    bt = torch.tensor(X5.T.copy(), requires_grad=True)
    lt = bt.T[1:4]
    lt_loss = TF.cross_entropy(lt, torch.tensor(t)) + TF.cross_entropy(lt[:1], torch.tensor([2]))
    lt_loss.backward()
    assert loss.grad_fn.inputs[0].name() == "cross_entropy"
    np.testing.assert_allclose(loss.item(), lt_loss.item(), **R64)
    np.testing.assert_allclose(base.grad.numpy(), bt.grad.numpy(), **R64)


def test_ce_input_updated_in_place_after_the_forward_still_backpropagates():
    """log_softmax saves its output, not its input: torch and the composite backpropagate
    after the logits are updated in place; the fused node saves the logits' version (it only
    reads them under create_graph) and raises instead."""
    def fn():
        x = hn.tensor(X5, requires_grad=True)
        x2 = x * 1.0
        loss = F.cross_entropy(x2, hn.tensor([0, 1, 2, 3, 0]))
        with hn.no_grad():
            x2.mul_(3.0)
        loss.backward()
        return [x.grad.numpy()]
    with fused.composites():
        want = fn()
    _assert_same(fn(), want)


# ---- linear and relu -----------------------------------------------------------------------


def _linear_vs_torch(make_x, make_w, make_b):
    xs, bs = make_x(hn), make_b(hn)
    ws = xs if make_w is make_x else make_w(hn)
    out = F.linear(xs[1], ws[1], None if bs is None else bs[1])
    assert out.grad_fn.name() == "linear"
    w = np.linspace(-1.5, 2.0, out.numel()).reshape(out.shape)
    (out * hn.tensor(w) * out).sum().backward()
    xt, bt = make_x(torch), make_b(torch)
    wt = xt if make_w is make_x else make_w(torch)
    ot = TF.linear(xt[1], wt[1], None if bt is None else bt[1])
    (ot * torch.tensor(w) * ot).sum().backward()
    np.testing.assert_allclose(_np(out), ot.detach().numpy(), **R64)
    for a, b in ((xs, xt), (ws, wt), (bs, bt)):
        if a is not None and a[0].requires_grad and a[0].grad is not None:
            np.testing.assert_allclose(a[0].grad.numpy(), b[0].grad.numpy(), **R64)


def _leaf(lib, arr, rg=True):
    return hn.tensor(arr, requires_grad=rg) if lib is hn else torch.tensor(arr, requires_grad=rg)


A = np.linspace(-2, 2, 60).reshape(5, 12)
W = np.cos(np.arange(42.0)).reshape(6, 7)


@pytest.mark.parametrize("case", ["view x", "transposed w", "expanded x", "3-d x", "x is w",
                                  "only bias", "0 rows"])
def test_linear_on_views_and_partial_grads_matches_torch(case):
    def leaf_and(view):
        return lambda arr, rg=True: (lambda lib: (lambda t: (t, view(t)))(_leaf(lib, arr, rg)))
    plain = leaf_and(lambda t: t)
    x, w, b = plain(A[:, :7]), plain(W), plain(np.arange(6.0))
    if case == "view x":
        x = leaf_and(lambda t: t[:, 2:9])(A)
    elif case == "transposed w":
        w = leaf_and(lambda t: t.T)(W.T.copy())
    elif case == "expanded x":
        x = leaf_and(lambda t: t.expand(5, 7))(A[:1, :7])
    elif case == "3-d x":
        x = plain(A.reshape(3, 4, 5)[..., :2].repeat(4, axis=-1)[..., :7])
    elif case == "x is w":
        x = w = plain(W)
        b = plain(np.arange(6.0))
    elif case == "only bias":
        x, w = plain(A[:, :7], False), plain(W, False)
    elif case == "0 rows":
        x = plain(np.zeros((0, 7)))
    _linear_vs_torch(x, w, b)


def test_relu_backward_gives_positive_zero_where_it_masks():
    """where(x > 0, g, 0) and torch give +0.0 at masked entries; the fused in-place path
    computes g * mask, -0.0 where g < 0 (1 / grad flips from inf to -inf)."""
    def fn():
        x = hn.tensor(np.array([-1.0, 2.0, -3.0]), requires_grad=True)
        (g,) = hn.grad(F.relu(x), [x], grad_outputs=[hn.tensor(np.array([-1.0, -1.0, -5.0]))])
        return g.numpy()
    got, want = _both(fn)
    np.testing.assert_array_equal(np.signbit(want), [False, True, False])
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_relu_on_views_with_non_finite_upstream_matches_torch():
    x = hn.tensor(np.array([[-1.0, 0.0, 2.0], [np.inf, -np.inf, 1e-300]]), requires_grad=True)
    up = np.array([[np.inf, np.nan, 2.0], [1.0, np.inf, -3.0]]).T
    (g,) = hn.grad(F.relu(x.T), [x], grad_outputs=[hn.tensor(up)])
    xt = torch.tensor(x.detach().numpy(), requires_grad=True)
    (gt,) = torch.autograd.grad(torch.relu(xt.T), [xt], torch.tensor(up))
    np.testing.assert_array_equal(g.numpy(), gt.numpy())


# ---- LSTM against torch --------------------------------------------------------------------


def _lstm_pair(cfg, x, hx, rg_hx=True):
    hn.manual_seed(0)
    kw = dict(num_layers=cfg.get("layers", 1), batch_first=cfg.get("bf", False),
              bidirectional=cfg.get("bi", False), bias=cfg.get("bias", True))
    m = hn.nn.LSTM(x.shape[-1], cfg["H"], dtype=np.float64, **kw)
    mt = torch.nn.LSTM(x.shape[-1], cfg["H"], dtype=torch.float64, **kw)
    with torch.no_grad():
        for name, p in mt.named_parameters():
            p.copy_(torch.from_numpy(getattr(m, name).detach().numpy().copy()))
    return m, mt


@pytest.mark.parametrize("cfg,steps,batch", [
    (dict(H=3, layers=2, bi=True, bf=True, hx=True), 5, 2),
    (dict(H=2, layers=2, bi=True, hx=True, bias=False), 1, 1),      # one step, one row
    (dict(H=3, bi=True, hx=True, unbatched=True), 4, None),
    (dict(H=1, layers=3), 3, 4),
])
def test_lstm_outputs_and_gradients_match_torch(cfg, steps, batch):
    rng = np.random.default_rng(1)
    layers, dirs = cfg.get("layers", 1), 2 if cfg.get("bi") else 1
    if cfg.get("unbatched"):
        xs, hs = (steps, 3), (layers * dirs, cfg["H"])
    else:
        xs = (batch, steps, 3) if cfg.get("bf") else (steps, batch, 3)
        hs = (layers * dirs, batch, cfg["H"])
    x = rng.standard_normal(xs)
    hx = (rng.standard_normal(hs), rng.standard_normal(hs)) if cfg.get("hx") else None
    wo = rng.standard_normal(xs[:-1] + (dirs * cfg["H"],))
    wh, wc = rng.standard_normal(hs), rng.standard_normal(hs)
    m, mt = _lstm_pair(cfg, x, hx)
    res = []
    for lib, mod in ((hn, m), (torch, mt)):
        xl = _leaf(lib, x)
        hl = None if hx is None else tuple(_leaf(lib, a) for a in hx)
        out, (h, c) = mod(xl, hl)
        if lib is hn:
            assert "lstm_layer" in _ops(out)
        t = hn.tensor if lib is hn else torch.tensor
        ((out * t(wo)).sum() + (h * t(wh)).sum() + (c * t(wc) * c).sum()).backward()
        grads = [xl.grad] + ([] if hl is None else [hl[0].grad, hl[1].grad]) + \
            [p.grad for p in mod.parameters()]
        res.append([out.detach().numpy(), h.detach().numpy(), c.detach().numpy()] +
                   [g.numpy() for g in grads])
    _assert_same(res[0], res[1], rtol=1e-9, atol=1e-11)


def test_lstm_cell_loop_over_window_reads_matches_torch_float32():
    """Per-step fused cells reading x[t] (window reads summed into one buffer)."""
    rng = np.random.default_rng(9)
    X, H = rng.standard_normal((6, 3, 4)).astype(np.float32), rng.standard_normal((3, 5))
    hn.manual_seed(0)
    cell = hn.nn.LSTMCell(4, 5)
    tc = torch.nn.LSTMCell(4, 5)
    with torch.no_grad():
        for n, p in tc.named_parameters():
            p.copy_(torch.from_numpy(getattr(cell, n).detach().numpy()))
    grads = []
    for lib, mod in ((hn, cell), (torch, tc)):
        x, h0 = _leaf(lib, X), _leaf(lib, H.astype(np.float32))
        h, c, tot = h0, h0 * 0.5, 0
        for t in range(6):
            h, c = mod(x[t], (h, c))
            tot = tot + (h * (t + 1)).sum() + c.sum() * 0.1 + (x[t][:, 1:3] * h[:, :2]).sum()
        tot.backward()
        grads.append([x.grad.numpy(), h0.grad.numpy()] + [p.grad.numpy() for p in mod.parameters()])
    _assert_same(grads[0], grads[1], rtol=2e-5, atol=2e-6)


# ---- LSTM against the composite: higher order, shared state, accumulation ------------------


def test_lstm_second_order_with_partial_requires_grad_matches_the_composite():
    rng = np.random.default_rng(5)
    X, H0 = rng.standard_normal((4, 2, 3)), rng.standard_normal((2, 2, 2))

    def fn():
        hn.manual_seed(0)
        lstm = hn.nn.LSTM(3, 2, dtype=np.float64, bidirectional=True)
        x = hn.tensor(X)  # (no grad: only the state and the weights)
        h0, c0 = hn.tensor(H0, requires_grad=True), hn.tensor(H0 * 0.5)
        out, (h, c) = lstm(x, (h0, c0))
        wrt = [h0] + list(lstm.parameters())
        gs = hn.grad((out * out).sum() + (c * h).sum(), wrt, create_graph=True)
        g2 = hn.grad(sum((g * g).sum() for g in gs), wrt, allow_unused=True)
        return [_np(g) for g in gs] + [_np(g) for g in g2]
    got, want = _both(fn)
    _assert_same(got, want)


@pytest.mark.parametrize("create_graph", [False, True])
def test_lstm_cell_with_one_tensor_as_h_and_c_matches_the_composite(create_graph):
    rng = np.random.default_rng(6)
    X, S = rng.standard_normal((2, 3)), rng.standard_normal((2, 2))

    def fn():
        hn.manual_seed(0)
        cell = hn.nn.LSTMCell(3, 2, dtype=np.float64)
        x, s = hn.tensor(X, requires_grad=True), hn.tensor(S, requires_grad=True)
        h, c = cell(x, (s, s))
        gs = hn.grad((h * c).sum() + (h * h).sum(), [x, s] + list(cell.parameters()),
                     create_graph=create_graph)
        res = [_np(g) for g in gs]
        if create_graph:
            res += [_np(g) for g in hn.grad(sum((g * g).sum() for g in gs), [x, s])]
        return res
    got, want = _both(fn)
    _assert_same(got, want)


def test_lstm_gradients_accumulate_over_calls_and_retained_backwards():
    X = np.random.default_rng(7).standard_normal((4, 2, 3))

    def fn():
        hn.manual_seed(0)
        lstm = hn.nn.LSTM(3, 2, dtype=np.float64, num_layers=2)
        x = hn.tensor(X, requires_grad=True)
        for k in range(2):
            out, (h, c) = lstm(x * (k + 1.0))
            loss = out.sum() + (c * c).sum()
            loss.backward(retain_graph=True)
            loss.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()
        return [x.grad.numpy()] + [p.grad.numpy() for p in lstm.parameters()]
    got, want = _both(fn)
    _assert_same(got, want)


def test_lstm_dropout_between_layers_and_eval_no_grad_match_the_composite():
    X = np.random.default_rng(8).standard_normal((3, 2, 3))

    def fn():
        hn.manual_seed(0)
        lstm = hn.nn.LSTM(3, 2, dtype=np.float64, num_layers=3, dropout=0.5)
        x = hn.tensor(X, requires_grad=True)
        hn.manual_seed(1)
        out, (h, c) = lstm(x)
        (out.sum() + c.sum()).backward()
        lstm.eval()
        with hn.no_grad():
            ev, _ = lstm(hn.tensor(X))
        assert not ev.requires_grad and ev.grad_fn is None
        return [_np(out), x.grad.numpy(), ev.numpy()] + [p.grad.numpy() for p in lstm.parameters()]
    got, want = _both(fn)
    _assert_same(got, want)


def test_lstm_in_place_update_of_a_saved_initial_state_raises():
    hn.manual_seed(0)
    lstm = hn.nn.LSTM(3, 2, dtype=np.float64)
    h0, c0 = hn.tensor(np.full((1, 1, 2), 0.5)), hn.tensor(np.ones((1, 1, 2)))
    out, _ = lstm(hn.tensor(np.ones((2, 1, 3)), requires_grad=True), (h0, c0))
    h0.mul_(7.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        out.sum().backward()


def test_lstm_output_updated_in_place_does_not_break_a_backward_that_never_reads_it():
    """torch and the composite backpropagate from (h_n, c_n) after `out` is zeroed under
    no_grad (nothing saved it); so does the fused layer, which keeps its own copy of the
    hidden states for W_hh's gradient (it had read them from its result and raised)."""
    X = np.random.default_rng(3).standard_normal((5, 2, 3))

    def fn():
        hn.manual_seed(0)
        lstm = hn.nn.LSTM(3, 2, dtype=np.float64)
        x = hn.tensor(X, requires_grad=True)
        out, (h, c) = lstm(x)
        loss = h.sum() + c.sum()
        with hn.no_grad():
            out.zero_()
        loss.backward()
        return [x.grad.numpy()] + [p.grad.numpy() for p in lstm.parameters()]
    with fused.composites():
        want = fn()
    _assert_same(fn(), want)


# ---- backward where primitives are recorded: the NumPy-only backward replays ---------------


def _lstm_model_grads(kind, backward_ctx):
    X = np.random.default_rng(3).standard_normal((5, 2, 3))
    hn.manual_seed(0)
    if kind == "layer":
        mod = hn.nn.LSTM(3, 2, dtype=np.float64, bidirectional=True)
        x = hn.tensor(X, requires_grad=True)
        out, (h, c) = mod(x)
    else:
        mod = hn.nn.LSTMCell(3, 2, dtype=np.float64)
        x = hn.tensor(X[0], requires_grad=True)
        out, c = mod(x)
    loss = (out * out).sum() + c.sum()
    with backward_ctx():
        loss.backward()
    return [_np(x.grad)] + [_np(p.grad) for p in mod.parameters()]


@pytest.mark.parametrize("kind", ["layer", "cell"])
def test_backward_inside_a_record_block_of_a_fused_lstm_tape_gives_the_gradients(kind):
    """The tape was made eagerly (fused); backward runs inside `hn.record()`, so the engine
    uses the history-building emitter: `replay` reruns the composite on value_of tensors that
    carry no history (wrap) and finds no gradient: every LSTM gradient is None."""
    want = _lstm_model_grads(kind, contextlib.nullcontext)
    got = _lstm_model_grads(kind, hn.record)
    _assert_same(got, want)


def test_a_traced_call_backpropagating_through_a_fused_lstm_tape_matches_eager():
    """First call of hn.trace(fn) runs fn while recording: the fused LSTM's replay finds no
    gradient (same cause as above), so x.grad stays None on that call."""
    hn.manual_seed(0)
    lstm = hn.nn.LSTM(3, 2, dtype=np.float64)
    x = hn.tensor(np.ones((2, 1, 3)), requires_grad=True)
    out, _ = lstm(x)
    loss = out.sum()
    loss.backward(retain_graph=True)
    want = x.grad.numpy().copy()

    def fn():
        loss.backward(retain_graph=True)

    traced = hn.trace(fn)
    for _ in range(2):
        x.grad = None
        traced()
        assert x.grad is not None
        np.testing.assert_allclose(x.grad.numpy(), want, **R64)


# ---- hn.graph_of on tapes with fused nodes -------------------------------------------------


def test_graph_of_keeps_the_in_place_check_of_a_fused_input():
    """After graph_of, the consumer reads the composite built from `make(n.value, ...)`:
    fresh tensors whose version counters are not the inputs', so an in-place update of x
    is no longer caught, and W's gradient silently uses the updated x (2x here)."""
    x = hn.tensor(np.random.default_rng(0).standard_normal((2, 3)))
    w = hn.tensor(np.arange(12.0).reshape(4, 3) / 10, requires_grad=True)
    y = F.linear(x, w).sum()
    hn.graph_of(y)
    x.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()


def _stale_case(case, read_graph):
    """A loss whose fused node has an input its own backward does not read (so not saved);
    that input is updated in place after the forward. Returns the gradient of the leaf."""
    hn.manual_seed(0)
    if case == "ce target":
        x = hn.tensor(X5[:2, :3], requires_grad=True)
        y = hn.tensor([0, 2])
        loss = F.cross_entropy(x, y) * 1.0
        y[0] = 1
    elif case == "relu input":
        x = hn.tensor(np.array([[1.0, -2.0, 3.0], [-0.5, 0.25, 2.0]]), requires_grad=True)
        x2 = x * 1.0
        loss = (F.relu(x2) * 1.0).sum()
        with hn.no_grad():
            x2.mul_(-1.0)
    else:  # "lstm c0"
        lstm = hn.nn.LSTM(3, 2, dtype=np.float64)
        x = hn.tensor(np.ones((2, 1, 3)), requires_grad=True)
        c0 = hn.tensor(np.ones((1, 1, 2)))
        out, _ = lstm(x, (hn.tensor(np.zeros((1, 1, 2))), c0))
        loss = (out * 1.0).sum()
        c0.mul_(7.0)
    if read_graph:
        hn.graph_of(loss)
    loss.backward()
    return x.grad.numpy()


@pytest.mark.parametrize("case", ["ce target", "relu input", "lstm c0"])
def test_graph_of_does_not_rebuild_a_fused_op_from_inputs_updated_since(case):
    """The fused backward uses what the forward saw (correct); graph_of reruns the composite
    on the inputs' current values (the closed-over target, an unsaved input), so the rewired
    backward silently differs. Either raise or keep the forward's gradient."""
    want = _stale_case(case, False)
    try:
        got = _stale_case(case, True)
    except RuntimeError as exc:
        assert "in-place" in str(exc)
        return
    np.testing.assert_allclose(got, want, **R64)


def test_graph_of_an_lstm_and_ce_tape_reruns_and_backpropagates_as_fused():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((4, 2, 3))

    def run(read_graph):
        hn.manual_seed(0)
        lstm = hn.nn.LSTM(3, 2, dtype=np.float64, bidirectional=True, num_layers=2)
        head = hn.nn.Linear(4, 3, dtype=np.float64)
        x = hn.tensor(X, requires_grad=True)
        h0 = hn.tensor(np.full((4, 2, 2), 0.3), requires_grad=True)
        out, (h, c) = lstm(x, (h0, h0 * 2))
        logits = head(F.relu(out)).reshape(-1, 3)
        loss = F.cross_entropy(logits, hn.tensor([0, 1, 2, -100, 1, 1, 0, 2])) + (h * c).sum()
        if read_graph:
            g = hn.graph_of(loss)
            assert not {"linear", "relu", "cross_entropy", "lstm_layer"} & {n.op for n in g.nodes}
            vals = {id(n): n.value for n in g.inputs}
            (rerun,) = g.run(*[vals[id(n)] for n in g.inputs])
            np.testing.assert_allclose(float(rerun), loss.item(), **R64)
        loss.backward()
        params = list(lstm.parameters()) + list(head.parameters())
        return [x.grad.numpy(), h0.grad.numpy()] + [p.grad.numpy() for p in params]
    _assert_same(run(True), run(False))


# ---- in-place summing backward, .grad layout -----------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_window_reads_chunks_and_casts_sum_into_one_buffer_as_torch(dtype):
    X = np.random.default_rng(2).standard_normal((4, 6, 5)).astype(dtype)

    def f(lib, x):
        tot = 0
        for t in range(4):
            tot = tot + (x[t] * x[t]).sum() * (t + 1)
        a, b, c = x.chunk(3, 1)
        tot = tot + (a * b * c).sum() + (x[:, ::2, 1:4] ** 3).sum() + x.sum() * 0.5
        wide = x[1:3].double() if lib is torch else x[1:3].to(hn.float64)
        return tot + (wide * 2).sum() + (x[-1, -1] * x[0, 0]).sum()
    xh, xt = hn.tensor(X, requires_grad=True), torch.tensor(X, requires_grad=True)
    f(hn, xh).backward()
    f(hn, xh).backward()  # (accumulates in place into the first .grad)
    f(torch, xt).backward()
    f(torch, xt).backward()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else R64
    np.testing.assert_allclose(xh.grad.numpy(), xt.grad.numpy(), **tol)
    (g,) = hn.grad(f(hn, xh), [xh])
    np.testing.assert_allclose(2 * g.numpy(), xt.grad.numpy(), **tol)


def test_leaf_grad_layout_follows_torch_for_transposed_strided_and_expanded_leaves():
    """PyTorch: a dense non-overlapping leaf's .grad has its strides, any other leaf's
    .grad is contiguous. np.empty_like of a 0-stride leaf gives a column-major buffer."""
    t = hn.tensor(np.arange(12.0).reshape(3, 4)).T.detach().requires_grad_()
    (t * t).sum().backward()
    assert t.grad.numpy().flags.f_contiguous
    np.testing.assert_array_equal(t.grad.numpy(), 2 * t.detach().numpy())
    s = hn.tensor(np.arange(24.0).reshape(4, 6))[:, ::2].detach().requires_grad_()
    (s * s).sum().backward()
    assert s.grad.numpy().flags.c_contiguous
    e = hn.ones(1, 3).expand(4, 3).detach().requires_grad_()
    (e * e).sum().backward()
    (e * e).sum().backward()
    np.testing.assert_array_equal(e.grad.numpy(), np.full((4, 3), 4.0, np.float32))
    assert e.grad.numpy().flags.c_contiguous  # (torch: stride (3, 1))


# ---- tracing twin (composite) against eager (fused) ----------------------------------------


def test_traced_lstm_classifier_with_adam_matches_the_fused_eager_twin():
    class Model(hn.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = hn.nn.LSTM(3, 3, bidirectional=True, batch_first=True,
                                   dtype=np.float64)
            self.head = hn.nn.Linear(6, 4, dtype=np.float64)

        def forward(self, x):
            out, (h, c) = self.lstm(x)
            return self.head(F.relu(out)).reshape(-1, 4), c

    def make():
        hn.manual_seed(0)
        m = Model()
        return m, hn.optim.Adam(m.parameters(), lr=0.01)

    def step(m, opt, x, y):
        opt.zero_grad()
        logits, c = m(x)
        loss = F.cross_entropy(logits, y, ignore_index=-1) + (c * c).mean() * 0.1
        loss.backward()
        opt.step()
        return loss.detach()

    (m1, o1), (m2, o2) = make(), make()
    traced = hn.trace(lambda x, y: step(m2, o2, x, y))
    rng = np.random.default_rng(7)
    for _ in range(3):
        x = hn.tensor(rng.standard_normal((2, 4, 3)))
        y = hn.tensor(rng.integers(-1, 4, 8))
        np.testing.assert_allclose(step(m1, o1, x, y).item(), traced(x, y).item(), **R64)
    for p, q in zip(m1.parameters(), m2.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-9, atol=1e-11)
    for s1, s2 in zip(o1.state.values(), o2.state.values()):
        for k in s1:
            np.testing.assert_allclose(np.asarray(s1[k].numpy() if hasattr(s1[k], "numpy")
                                                  else s1[k]),
                                       np.asarray(s2[k].numpy() if hasattr(s2[k], "numpy")
                                                  else s2[k]), rtol=1e-9, atol=1e-11)
