"""Second adversarial review of the eager-speed commits (06760e8..HEAD): the in-place summing
backward (dispatch.SummingEmitter, autodiff._accumulate_window), the x.sum() fast path, BLAS
threads from 5e7 multiply-adds, and traced training steps against their fused eager twins.
Oracles: PyTorch (float64), the non-summing emitter (a backward run inside `hn.record()`
takes EagerEmitter and the composites) and the composites (`fused.composites()`). Each test
asserts the correct behaviour; see tests/test_fused_adversarial.py for the first review."""

import numpy as np
import pytest
import torch

import hybridnet as hn
import hybridnet.nn.functional as F
from compiler import blas
from hybridnet import fused

R64 = dict(rtol=1e-10, atol=1e-12)
R32 = dict(rtol=2e-5, atol=2e-6)


def _np(t):
    return None if t is None else t.detach().numpy()


def _pair(a, dtype=np.float64):
    a = np.asarray(a, dtype)
    return hn.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


# ---- (a) the summed buffers: nothing the caller holds may change ---------------------------


def _identity_chain(m, x):
    """Paths whose vjps hand the incoming gradient on unchanged (add, reshape, view,
    same-dtype cast, expand's sum_to of equal shape) into one node, plus window reads."""
    y = x + 0.0
    z = y.reshape(-1).reshape(x.shape)
    c = z.to(z.dtype)
    w = c * 2 + y + x[1:4].sum() + x[::2].sum() * 3 + x[-2:, 1:].sum() + (x[0:3] * x[1:4]).sum()
    e = x[0:1].expand(x.shape[0], x.shape[1])
    return (w * w).sum() + z.sum() + (e * y).sum() + x.detach().sum()


def test_identity_vjp_chains_several_paths_and_windows_match_torch():
    a = np.random.default_rng(0).standard_normal((5, 4))
    x, xt = _pair(a)
    _identity_chain(hn, x).backward()
    _identity_chain(torch, xt).backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), **R64)


def test_hn_grad_results_are_not_changed_by_later_backwards():
    """hn.grad hands out the engine's summed buffers: later backwards (retained, into
    .grad, and hn.grad again) must not sum into them."""
    a = np.random.default_rng(1).standard_normal((5, 4))
    x = hn.tensor(a, requires_grad=True)
    y = x + 1.0
    z = y.reshape(4, 5)
    loss = (z * z).sum() + z[0].sum() + y[1].sum() + y[1].sum() + (y[0:2] * 3).sum()
    gz, gy, gx = hn.grad(loss, [z, y, x], retain_graph=True)
    held = [g.numpy().copy() for g in (gz, gy, gx)]
    loss.backward(retain_graph=True)
    loss.backward(retain_graph=True)
    again = hn.grad(loss, [z, y, x])
    for g, h, g2 in zip((gz, gy, gx), held, again):
        np.testing.assert_array_equal(g.numpy(), h)
        np.testing.assert_array_equal(g2.numpy(), h)
    np.testing.assert_allclose(x.grad.numpy(), 2 * held[2], **R64)


def test_gradient_argument_and_a_held_grad_keep_their_values():
    rng = np.random.default_rng(2)
    a, v = rng.standard_normal((5, 4)), rng.standard_normal((5, 4))
    x, xt = _pair(a)
    gv = hn.tensor(v.copy())
    y = x * 1.0
    (y + y[0:1] + y.reshape(5, 4)).backward(gv)
    np.testing.assert_array_equal(gv.numpy(), v)
    first = x.grad
    snapshot = first.numpy().copy()
    (x[1:4].sum() + x.sum()).backward()  # accumulates into .grad (as torch: in place)
    yt = xt * 1.0
    (yt + yt[0:1] + yt.reshape(5, 4)).backward(torch.tensor(v))
    np.testing.assert_allclose(snapshot, xt.grad.numpy(), **R64)
    (xt[1:4].sum() + xt.sum()).backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), **R64)


def test_backward_inputs_subset_through_windows_matches_torch():
    a = np.random.default_rng(3).standard_normal((4, 3))
    (x, xt), (w, wt) = _pair(a), _pair(a[::-1].copy())

    def f(x, w):
        y = x * w
        return y[0:2].sum() + (y[1:3] * w[1:3]).sum() + (y + x).sum()

    f(x, w).backward(inputs=[w])
    f(xt, wt).backward(inputs=[wt])
    assert x.grad is None and xt.grad is None
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), **R64)


def test_where_and_detach_paths_with_windows_match_torch():
    a = np.random.default_rng(4).standard_normal((5, 4))
    x, xt = _pair(a)

    def f(m, x):
        y = m.where(x > 0, x, x * 2)
        return (y[1:] * y[:-1]).sum() + y[2].sum() + (x.detach() * y).sum() + y.sum()

    f(hn, x).backward()
    f(torch, xt).backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), **R64)


# ---- (b) window reads ------------------------------------------------------------------------


def _windows(x):
    return (x[2:2].sum() + x[::3].sum() * 2 + x[1:5:2, ::2].sum() + x[-1].sum()
            + (x[0:4] * x[2:6]).sum() + x.narrow(1, 1, 2).sum() * 0.5
            + sum((c * (k + 1)).sum() for k, c in enumerate(x.chunk(3, 0)))
            + x[:, -1:].sum() + x[0].sum())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_window_reads_with_steps_negative_empty_and_overlapping_match_torch(dtype):
    a = np.random.default_rng(5).standard_normal((6, 3))
    x, xt = _pair(a, dtype)
    _windows(x).backward()
    _windows(xt).backward()
    assert x.grad.numpy().dtype == dtype
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), **(R64 if dtype == np.float64
                                                                   else R32))


def test_window_reads_of_a_transposed_view_of_a_leaf_match_torch():
    a = np.random.default_rng(6).standard_normal((5, 4))
    x, xt = _pair(a)

    def f(x):
        v = x.t()
        return v[1:3].sum() * 3 + v[::2, 1:].sum() + (v[0] * v[3]).sum() + (v[1:] * v[:-1]).sum()

    f(x).backward()
    f(xt).backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), **R64)


def test_window_reads_of_a_fused_output_match_the_composite():
    rng = np.random.default_rng(7)
    a, w = rng.standard_normal((6, 5)), rng.standard_normal((4, 5))

    def run():
        x, W = hn.tensor(a, requires_grad=True), hn.tensor(w, requires_grad=True)
        h = F.relu(F.linear(x, W))
        loss = (h[1:4] * h[0:3]).sum() + h[::2].sum() + (h * h).sum() + h[-1].sum()
        loss.backward()
        return [x.grad.numpy(), W.grad.numpy()]

    got = run()
    with fused.composites():
        want = run()
    for g, wv in zip(got, want):
        np.testing.assert_allclose(g, wv, **R64)


# ---- the summing engine against the plain one, on random graphs ----------------------------


def _random_program(seed):
    rng = np.random.default_rng(seed)
    dt = np.float64 if seed % 3 else np.float32
    shape = (int(rng.integers(2, 6)), int(rng.integers(2, 6)))
    arrays = [rng.standard_normal(shape).astype(dt) for _ in range(2)]
    choices = [(int(rng.integers(0, 16)), int(rng.integers(0, 1000)), int(rng.integers(0, 1000)),
                int(rng.integers(0, 1000)), int(rng.integers(0, 1000)))
               for _ in range(int(rng.integers(4, 14)))]

    def build():
        leaves = [hn.tensor(a, requires_grad=True) for a in arrays]
        pool = list(leaves)
        for k, i, j, r1, r2 in choices:
            a, b = pool[i % len(pool)], pool[j % len(pool)]
            n0 = a.shape[0]
            if k == 0 and a.shape == b.shape:
                v = a + b
            elif k == 1 and a.shape == b.shape:
                v = a * b
            elif k == 2:
                v = a.reshape(-1).reshape(a.shape)
            elif k == 3:
                v = a.t()
            elif k == 4 and n0 > 1:
                s = r1 % n0
                v = a[s:s + 1 + r2 % (n0 - s):1 + r2 % 2]
            elif k == 5:
                v = a[r1 % (2 * n0) - n0].unsqueeze(0).expand(n0, a.shape[1])
            elif k == 6 and a.shape[1] >= 2:
                v = hn.cat(list(a.chunk(2, 1))[::-1], 1)
            elif k == 7:
                v = F.relu(a)
            elif k == 8:
                v = a.to(a.dtype) + 0.0
            elif k == 9 and a.shape == b.shape:
                v = hn.where(a > 0, a, b)
            elif k == 10:
                v = F.linear(a, hn.tensor(np.full((3, a.shape[1]), 0.3, dt)))
            elif k == 11:
                v = a.detach() * a
            elif k == 12:
                v = a.sum(0, keepdim=True).expand(n0, a.shape[1]) * 0.5
            elif k == 13:
                v = a.narrow(1, 0, 1).expand(n0, a.shape[1])
            elif k == 14:
                v = a[:, ::2].sum() * a
            elif k == 15:
                v = hn.stack([a[0], a[-1]], 0).sum(0) + a
            else:
                v = a.tanh()
            pool.append(v)
        loss = sum((p * p).sum() * 0.01 + p.sum() for p in pool[2:])
        inner = [p for p in pool[2:] if p._rg][:2]
        grads = hn.grad(loss, leaves + inner, retain_graph=True, allow_unused=True)
        held = [None if g is None else g.numpy().copy() for g in grads]
        loss.backward(retain_graph=True)
        loss.backward()
        after = [None if g is None else g.numpy() for g in grads]
        return [_np(lf.grad) for lf in leaves], held, after

    return build, dt


@pytest.mark.parametrize("block", range(4))
def test_random_graphs_sum_as_the_plain_engine_does(block):
    """Eager backward (summing in place, fused) against the same program run inside
    `hn.record()` (EagerEmitter, composites): .grad after two backwards, hn.grad of leaves
    and inner nodes, and those hn.grad results unchanged by the later backwards."""
    for seed in range(block * 25, block * 25 + 25):
        build, dt = _random_program(seed)
        got = build()
        with hn.record():
            want = build()
        tol = R64 if dt == np.float64 else dict(rtol=1e-4, atol=1e-5)
        for g, w in zip(got[0], want[0]):
            assert (g is None) == (w is None), seed
            if g is not None:
                np.testing.assert_allclose(g, w, **tol, err_msg=f"seed {seed}")
        for g, w, after in zip(got[1], want[1], got[2]):
            assert (g is None) == (w is None), seed
            if g is not None:
                np.testing.assert_allclose(g, w, **tol, err_msg=f"seed {seed}")
                np.testing.assert_array_equal(after, g, err_msg=f"seed {seed}")


# ---- compiled calls inside a larger eager graph ----------------------------------------------


def test_compiled_call_outputs_read_by_windows_and_directly_match_eager():
    rng = np.random.default_rng(8)
    hn.manual_seed(0)
    lin = hn.nn.Linear(4, 6, dtype=np.float64)

    def body(x):
        h = F.relu(lin(x))
        return h, h * 2.0

    traced = hn.trace(body)

    def loss_of(fn, x):
        h, h2 = fn(x)
        return ((h[1:3] * h2[0:2]).sum() + h[::2].sum() + (h * h).sum() + x[2].sum()
                + h2.sum() + (x[0:2] * h[0:2, :4]).sum())

    for _ in range(4):
        a = rng.standard_normal((5, 4))
        grads = []
        for fn in (traced, body):
            x = hn.tensor(a, requires_grad=True)
            lin.zero_grad(set_to_none=True)
            ctx = fused.composites() if fn is body else _nullcontext()
            with ctx:
                loss = loss_of(fn, x)
            loss.backward()
            grads.append([x.grad.numpy()] + [p.grad.numpy() for p in lin.parameters()])
        for g, w in zip(*grads):
            np.testing.assert_allclose(g, w, **R64)
    assert traced.stats.compiled_calls >= 2


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ---- (c) the x.sum() fast path -----------------------------------------------------------------


SUM_CASES = [np.array(2.5), np.zeros((0, 3)), np.arange(12.0).reshape(3, 4).T,
             np.random.default_rng(9).standard_normal((2, 3, 4))[:, ::2],
             np.float32(1e8) + np.arange(1000, dtype=np.float32)]


@pytest.mark.parametrize("case", range(len(SUM_CASES)))
@pytest.mark.parametrize("keepdim", [False, True])
def test_whole_sum_matches_torch_values_shapes_and_gradients(case, keepdim):
    a = SUM_CASES[case]
    x, xt = _pair(a, a.dtype)
    s = x.sum(keepdim=keepdim)
    st = xt.sum(dim=tuple(range(a.ndim)), keepdim=True) if keepdim and a.ndim else xt.sum()
    assert tuple(s.shape) == tuple(st.shape) and s.dtype == hn.tensor(a).dtype
    np.testing.assert_allclose(_np(s), _np(st), rtol=1e-6 if a.dtype == np.float32 else 1e-12)
    s.backward(hn.tensor(np.full(s.shape, 1.5, a.dtype)))
    st.backward(torch.full(st.shape, 1.5, dtype=st.dtype))
    np.testing.assert_array_equal(x.grad.numpy(), xt.grad.numpy())


def test_whole_sum_of_a_parameter_recorded_and_traced():
    rng = np.random.default_rng(10)
    p = hn.nn.Parameter(hn.tensor(rng.standard_normal((3, 4))))
    assert p.sum(keepdim=True).shape == (1, 1)
    p.sum().backward()
    np.testing.assert_array_equal(p.grad.numpy(), np.ones((3, 4)))
    with hn.record() as rec:
        hn.tensor(rng.standard_normal((3, 4))).sum(keepdim=True)
    assert [n.op for n in rec.graph.nodes if n.op == "sum"] == ["sum"]
    f = hn.trace(lambda x: x.sum(keepdim=True) * 2 + x.sum())
    for i in range(3):
        np.testing.assert_array_equal(f(hn.tensor(np.full((2, 3), float(i)))).numpy(),
                                      [[18.0 * i]])
    assert f.stats.compiled_calls >= 1


# ---- (d) BLAS around LARGE_MACS ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mkn", [(500, 1000, 100), (499, 1000, 100), (100, 1000, 500)])
def test_products_around_the_thread_threshold_match_numpy(dtype, mkn):
    m, k, n = mkn
    rng = np.random.default_rng(11)
    a0, b0 = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    layouts = [(a0, b0), (np.asfortranarray(a0), b0), (a0, np.asfortranarray(b0)),
               (np.asfortranarray(a0), np.asfortranarray(b0)),
               (np.repeat(a0, 2, axis=1)[:, ::2], b0)]
    for a, b in layouts:
        got = blas.matmul(a, b)
        want = a.astype(np.float64) @ b.astype(np.float64)
        assert got.dtype == dtype and got.shape == (m, n)
        np.testing.assert_allclose(got, want, rtol=0, atol=(2e-4 if dtype == np.float32 else
                                                            1e-11) * np.abs(want).max())
    x = hn.tensor(a0, requires_grad=True)
    w = hn.tensor(np.ascontiguousarray(b0.T), requires_grad=True)
    F.linear(x, w).sum().backward()
    tol = 2e-5 if dtype == np.float32 else 1e-12
    gx = np.broadcast_to(b0.astype(np.float64).sum(1), (m, k))
    gw = np.broadcast_to(a0.astype(np.float64).sum(0), (n, k))
    np.testing.assert_allclose(x.grad.numpy(), gx, rtol=0, atol=tol * np.abs(gx).max())
    np.testing.assert_allclose(w.grad.numpy(), gw, rtol=0, atol=tol * np.abs(gw).max())


# ---- (e) traced training steps against their eager twins ---------------------------------------


def _state(model, opt):
    params = [p.detach().numpy().copy() for p in model.parameters()]
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    state = []
    for s in opt.state.values():
        for k in sorted(s):
            v = s[k]
            state.append(np.asarray(v.numpy() if hasattr(v, "numpy") else v, np.float64))
    return params, grads, state


def _assert_twins(s1, s2, tol):
    for a, b in zip(s1, s2):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, **tol)


class _LM(hn.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = hn.nn.LSTM(3, 4, num_layers=2, dtype=np.float64)
        self.head = hn.nn.Linear(4, 5, dtype=np.float64)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        logits = self.head(F.relu(out)).reshape(-1, 5)
        return logits + 0.1 * self.head(h[-1]).sum() + 0.01 * c.sum()


@pytest.mark.parametrize("opt_kind", ["sgd", "adam"])
def test_traced_lstm_lm_steps_match_eager_fused_and_composite_twins(opt_kind):
    def make():
        hn.manual_seed(0)
        m = _LM()
        opt = hn.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                           weight_decay=0.01) if opt_kind == "sgd" else \
            hn.optim.Adam(m.parameters(), lr=0.01, weight_decay=0.01)
        return m, opt

    def step(m, opt, x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    twins = [make() for _ in range(3)]
    traced = hn.trace(lambda x, y: step(*twins[2], x, y))
    rng = np.random.default_rng(12)
    for _ in range(4):
        x = hn.tensor(rng.standard_normal((5, 2, 3)))
        y = hn.tensor(rng.integers(0, 5, 10))
        l0 = step(*twins[0], x, y)
        with fused.composites():
            l1 = step(*twins[1], x, y)
        l2 = traced(x, y)
        np.testing.assert_allclose(l0.item(), l1.item(), **R64)
        np.testing.assert_allclose(l0.item(), l2.item(), **R64)
        s = [_state(*t) for t in twins]
        _assert_twins(s[0], s[1], R64)
        _assert_twins(s[0], s[2], R64)
    assert traced.stats.compiled_calls >= 2


def test_eager_mlp_training_with_sgd_momentum_matches_torch():
    rng = np.random.default_rng(13)
    ws = [rng.standard_normal((8, 6)) * 0.4, rng.standard_normal(8) * 0.1,
          rng.standard_normal((3, 8)) * 0.4, rng.standard_normal(3) * 0.1]
    hp = [hn.nn.Parameter(hn.tensor(w.copy())) for w in ws]
    tp = [torch.nn.Parameter(torch.tensor(w.copy())) for w in ws]
    ho = hn.optim.SGD(hp, lr=0.1, momentum=0.9, weight_decay=1e-3)
    to = torch.optim.SGD(tp, lr=0.1, momentum=0.9, weight_decay=1e-3)
    for _ in range(5):
        xa, ya = rng.standard_normal((7, 6)), rng.integers(0, 3, 7)
        for F_, ps, opt, x, y in ((F, hp, ho, hn.tensor(xa), hn.tensor(ya)),
                                  (torch.nn.functional, tp, to, torch.tensor(xa),
                                   torch.tensor(ya))):
            opt.zero_grad()
            h = F_.relu(F_.linear(x, ps[0], ps[1]))
            logits = F_.linear(h, ps[2], ps[3])
            loss = F_.cross_entropy(logits, y) + F_.cross_entropy(logits[1:], y[1:]) \
                + (h[0:3] * h[2:5]).sum() * 0.01
            loss.backward()
            opt.step()
        for a, b in zip(hp, tp):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), **R64)
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), **R64)


def test_column_major_weight_alternating_eager_and_traced_steps_match_an_eager_twin():
    """A column-major weight gets a column-major .grad (autograd._accumulate); kept across
    steps (zero_grad(set_to_none=False)) and read by traced steps between eager ones."""
    rng = np.random.default_rng(14)
    w0 = np.asfortranarray(rng.standard_normal((5, 4)))

    def make():
        ps = [hn.nn.Parameter(hn.tensor(w0.copy(order="F"))),
              hn.nn.Parameter(hn.tensor(np.zeros(5)))]
        return ps, hn.optim.SGD(ps, lr=0.1, momentum=0.9)

    def step(ps, opt, x, y):
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(F.linear(x, ps[0], ps[1]), y) + \
            (ps[0][1:3] * ps[0][0:2]).sum() * 0.1 + ps[0].t()[1].sum()
        loss.backward()
        opt.step()
        return loss.detach()

    (p1, o1), (p2, o2) = make(), make()
    traced = hn.trace(lambda x, y: step(p2, o2, x, y))
    for i in range(6):
        x, y = hn.tensor(rng.standard_normal((3, 4))), hn.tensor(rng.integers(0, 5, 3))
        a = step(p1, o1, x, y)
        b = traced(x, y) if i % 2 else step(p2, o2, x, y)
        np.testing.assert_allclose(a.item(), b.item(), **R64)
        for u, v in zip(p1, p2):
            np.testing.assert_allclose(u.detach().numpy(), v.detach().numpy(), **R64)
            np.testing.assert_allclose(u.grad.numpy(), v.grad.numpy(), **R64)
    assert p1[0].grad.numpy().flags.f_contiguous
    assert traced.stats.compiled_calls >= 1
