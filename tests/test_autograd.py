"""Autograd semantics: accumulation, retain_graph, hn.grad, higher order, version counter."""

import numpy as np
import pytest

import hybridnet as hn


def test_grad_accumulates_on_leaves_across_backward_calls():
    x = hn.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * x).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.array([1, 2, 3]) + 3)


def test_grad_of_reused_tensor_sums_paths():
    x = hn.tensor(2.0, requires_grad=True)
    y = x * x + x * 3.0 + x.exp()
    y.backward()
    assert x.grad.item() == pytest.approx(2 * 2 + 3 + np.exp(2.0), rel=1e-6)


def test_broadcast_gradients_are_summed_back():
    a = hn.randn(4, 3, requires_grad=True)
    b = hn.randn(3, requires_grad=True)
    c = hn.randn(4, 1, requires_grad=True)
    ((a + b) * c).sum().backward()
    assert b.grad.shape == (3,) and c.grad.shape == (4, 1)
    np.testing.assert_allclose(b.grad.numpy(), np.broadcast_to(c.numpy() if not c.requires_grad
                                                               else c.detach().numpy(),
                                                               (4, 3)).sum(0), rtol=1e-6)
    np.testing.assert_allclose(c.grad.numpy()[:, 0],
                               (a.detach().numpy() + b.detach().numpy()).sum(1), rtol=1e-5)


def test_backward_with_explicit_gradient():
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3.0
    y.backward(hn.tensor([1.0, 10.0]))
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 30.0])


def test_retain_graph_allows_second_backward():
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    y = (x.tanh() * x).sum()
    y.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * first, rtol=1e-6)


def test_hn_grad_does_not_touch_dot_grad_and_handles_intermediates():
    x = hn.tensor([0.5, -1.0], requires_grad=True)
    h = x * 2.0
    y = (h * h).sum()
    gx, gh = hn.grad(y, [x, h])
    assert x.grad is None
    np.testing.assert_allclose(gh.numpy(), 2 * h.detach().numpy())
    np.testing.assert_allclose(gx.numpy(), 8 * x.detach().numpy())


def test_second_derivative_with_create_graph():
    x = hn.tensor([0.3, 1.2, -0.7], dtype=hn.float64, requires_grad=True)
    y = (x.sin() * x * x).sum()
    (g,) = hn.grad(y, x, create_graph=True)
    (gg,) = hn.grad(g.sum(), x)
    xv = x.detach().numpy()
    np.testing.assert_allclose(g.detach().numpy(), np.cos(xv) * xv**2 + 2 * xv * np.sin(xv))
    expected = -np.sin(xv) * xv**2 + 4 * xv * np.cos(xv) + 2 * np.sin(xv)
    np.testing.assert_allclose(gg.numpy(), expected, rtol=1e-10)


def test_third_derivative_of_tanh():
    x = hn.tensor(0.4, dtype=hn.float64, requires_grad=True)
    (g1,) = hn.grad(x.tanh(), x, create_graph=True)
    (g2,) = hn.grad(g1, x, create_graph=True)
    (g3,) = hn.grad(g2, x)
    t = np.tanh(0.4)
    assert g3.item() == pytest.approx(-2 * (1 - t * t) ** 2 + 4 * t * t * (1 - t * t), rel=1e-9)


def test_unused_input_raises_unless_allowed():
    x = hn.tensor([1.0], requires_grad=True)
    z = hn.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="not used"):
        hn.grad((x * 2.0).sum(), [x, z])
    gx, gz = hn.grad((x * 2.0).sum(), [x, z], allow_unused=True)
    assert gz is None and gx.item() == 2.0


def test_no_grad_and_enable_grad():
    x = hn.tensor([1.0], requires_grad=True)
    with hn.no_grad():
        y = x * 2.0
        assert not hn.is_grad_enabled()
        with hn.enable_grad():
            z = x * 2.0
    assert hn.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad and z.grad_fn is not None

    @hn.no_grad()
    def f(t):
        return t * 3.0
    assert not f(x).requires_grad


def test_detach_shares_memory_and_cuts_history():
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    y = (x * 2.0).detach()
    assert not y.requires_grad and y.is_leaf
    d = x.detach()
    with hn.no_grad():
        d.add_(1.0)
    np.testing.assert_allclose(x.detach().numpy(), [2.0, 3.0])


def test_is_leaf_and_grad_fn():
    x = hn.tensor([1.0], requires_grad=True)
    y = x * 2.0
    assert x.is_leaf and x.grad_fn is None
    assert not y.is_leaf and y.grad_fn.op == "mul"
    assert hn.tensor([1.0]).is_leaf


def test_inplace_on_saved_value_raises_like_pytorch_version_counter():
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    h = x * 1.0
    y = (h * h).sum()  # mul saves h
    with hn.no_grad():
        h.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()


def test_inplace_on_value_not_saved_is_fine():
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    h = x * 1.0
    y = (h + 1.0).sum()  # add saves nothing
    with hn.no_grad():
        h.mul_(2.0)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0])


def test_inplace_with_autograd_rebases_history():
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    h = x * 1.0
    h.mul_(3.0)
    h.add_(x)
    h.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 4.0])
    assert h.grad_fn.op == "add"


def test_inplace_on_leaf_requiring_grad_raises_outside_no_grad():
    w = hn.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        w.add_(1.0)
    with hn.no_grad():
        w.add_(1.0)
    assert w.item() == 2.0


def test_view_shares_version_counter():
    x = hn.tensor([1.0, 2.0, 3.0], requires_grad=True)
    h = x * 1.0
    v = h[1:]
    y = (v * v).sum()
    with hn.no_grad():
        h.mul_(2.0)  # changes v's data too
    with pytest.raises(RuntimeError, match="in-place"):
        y.backward()


def test_backward_through_matmul_chain_matches_numpy():
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(s) for s in [(3, 4), (4, 5), (5,)])
    ta, tb, tc = (hn.tensor(v, requires_grad=True) for v in (a, b, c))
    ((ta @ tb) @ tc).sum().backward()
    np.testing.assert_allclose(ta.grad.numpy(), np.outer(np.ones(3), b @ c), rtol=1e-12)
    np.testing.assert_allclose(tc.grad.numpy(), (a @ b).sum(0), rtol=1e-12)


def test_grad_dtype_matches_leaf_dtype():
    x64 = hn.tensor([1.0, 2.0], dtype=hn.float64, requires_grad=True)
    x32 = hn.tensor([1.0, 2.0], requires_grad=True)
    (x64 * x32).sum().backward()
    assert x64.grad.dtype == hn.float64 and x32.grad.dtype == hn.float32


def test_integer_ops_in_graph_do_not_block_gradients():
    x = hn.tensor([0.5, 1.5, 2.5], requires_grad=True)
    idx = x.argmax()
    y = x[idx] * 2.0
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.0, 2.0])


# ---- gradients summed in place (hybridnet.dispatch.SummingEmitter) ------------------------


def test_window_reads_sum_into_one_gradient():
    """x[t] per step, chunks of a row, and a whole-tensor use: the gradient of each window
    lands in its window, the overlapping uses add (float64 reference)."""
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((5, 3, 8))
    ws = rng.standard_normal((5, 3, 8))
    x = hn.tensor(xv, requires_grad=True)
    loss = (x * x).sum()
    for t in range(5):
        a, b = x[t].chunk(2, -1)
        loss = loss + (a * hn.tensor(ws[t, :, :4])).sum() + (b * b).sum() + x[t, 1:, ::3].sum()
    loss.backward()
    want = 2 * xv
    want[:, :, :4] += ws[:, :, :4]
    want[:, :, 4:] += 2 * xv[:, :, 4:]
    want[:, 1:, ::3] += 1
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-12)


def test_summing_never_writes_into_a_callers_gradient():
    """add's vjp hands the incoming gradient on as is: summing a second contribution
    must not write into that array (here the caller's grad_outputs)."""
    x = hn.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    y = x + x
    seed = hn.tensor(np.full((2, 3), 0.5))
    (gx,) = hn.grad(y, [x], grad_outputs=[seed])
    np.testing.assert_array_equal(seed.numpy(), np.full((2, 3), 0.5))
    np.testing.assert_array_equal(gx.numpy(), np.ones((2, 3)))
    z = (x + x).reshape(3, 2)
    (z[0] + z[0] + z[1]).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * np.array([[2, 2, 1], [1, 0, 0.0]]))


def test_grad_from_summed_buffer_is_not_changed_by_later_backward():
    """A leaf's .grad taken from one backward keeps its values after another backward."""
    x = hn.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x[:2].sum() + x[1:].sum() + x.sum()).backward()
    first = x.grad
    kept = first.numpy().copy()
    np.testing.assert_array_equal(kept, [2, 3, 2])
    (x[:2].sum() * 4).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [6, 7, 2])
    g = hn.grad((x[::2] * 3).sum() + x.sum(), [x])[0]
    np.testing.assert_array_equal(g.numpy(), [4, 1, 4])
    assert x.grad.numpy().tolist() == [6, 7, 2]


def test_window_gradients_under_create_graph_keep_history():
    """create_graph backward takes the ordinary path (pad_slice + add, with history)."""
    x = hn.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = (x[:2] ** 3).sum() + (x[1:] ** 2).sum()
    (g,) = hn.grad(y, [x], create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), [3.0, 12 + 4, 6])
    g.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0, 12 + 2, 2])


def test_grad_with_respect_to_one_tensor_listed_twice_gives_it_in_both_places():
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    y = hn.tensor([3.0], requires_grad=True)
    gx1, gy, gx2 = hn.grad((x * x).sum() + (y * 2.0).sum(), [x, y, x])
    np.testing.assert_array_equal(gx1.numpy(), [2.0, 4.0])
    np.testing.assert_array_equal(gx2.numpy(), [2.0, 4.0])
    np.testing.assert_array_equal(gy.numpy(), [2.0])
