"""Adversarial review of the per-step overhead changes (fb3622d, 5cac38e, 453485d):

- hybridnet/indexing.py: `t[i]` for a plain Python int, with nothing recording and no
  autograd involved, returns NumPy's view directly (and `_parse` has a short path for it);
- hybridnet/jit/call_node.py: `CallRecord.attach` rewritten with plain loops;
- runtime/heap.py: glibc mallopt thresholds at import (HYBRIDNET_MALLOC=default opts out);
- runtime/llvm_engine.py: kernels emitted with `-disable-lsr=true` (HYBRIDNET_LLVM_LSR=1
  keeps LSR) and compiler/lowering/llvm_call.py: `hn_call` is optnone noinline.

Oracles: for indexing, the general path (`x[(i,)]`, `x[np.int64(i)]` take the code that
`x[i]` took before the short path); for the JIT, the same scenario run eagerly (the
function untraced): values, `.grad`, `._version` and the exception types must agree; for
the heap and LSR switches, a fresh process with the other setting (bit-identical).
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import hybridnet as hn
from hybridnet import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _arr(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---- indexing: the int short path against the general path ------------------------------


def _bases():
    """(name, tensor) of many layouts: contiguous, 1-d, 0-size dims, permuted, transposed,
    stepped slices, a read-only expand, integer and bool dtypes."""
    out = [
        ("3x4", hn.tensor(_arr((3, 4), 0))),
        ("1d", hn.tensor(_arr((5,), 1))),
        ("1elem", hn.tensor(_arr((1,), 2))),
        ("3x0", hn.zeros(3, 0)),
        ("2x0x4", hn.zeros(2, 0, 4)),
        ("4x1x3", hn.tensor(_arr((4, 1, 3), 3))),
        ("permuted", hn.tensor(_arr((2, 3, 4), 4)).permute(2, 0, 1)),
        ("transposed", hn.tensor(_arr((3, 5), 5)).t()),
        ("stepped", hn.tensor(_arr((7, 6), 6))[::2, 1::3]),
        ("stepped1d", hn.tensor(_arr((9,), 7))[1::4]),
        ("expand", hn.tensor(_arr((1, 3), 8)).expand(4, 3)),
        ("int64", hn.arange(12).reshape(4, 3)),
        ("bool", hn.tensor(_arr((3, 2), 9)) > 0),
        ("float64", hn.tensor(_arr((3, 2, 2), 10, np.float64))),
    ]
    return out


def _ints(n):
    return sorted({0, n - 1, -1, -n, n // 2, -(n // 2) - 1} & set(range(-n, n))) if n else []


def _cases():
    for name, base in _bases():
        for i in _ints(base.shape[0]):
            yield name, i


@pytest.mark.parametrize("name,i", list(_cases()))
def test_int_index_equals_the_general_path(name, i):
    base = dict(_bases())[name]
    fast = base[i]
    for other in (base[(i,)], base[np.int64(i)], base[i, ...]):
        assert fast.shape == other.shape and fast.dtype == other.dtype
        a, b = fast._data, other._data
        assert type(a) is np.ndarray and a.shape == b.shape  # (0-d: an ndarray, no scalar)
        assert a.flags.writeable == b.flags.writeable
        if a.size:  # (an empty array's strides and address mean nothing)
            assert a.strides == b.strides
            assert a.__array_interface__["data"] == b.__array_interface__["data"]
        np.testing.assert_array_equal(a, b)
        assert (fast._vc is base._vc) == (other._vc is base._vc)
        assert fast.requires_grad is other.requires_grad is False
        assert fast.is_leaf and fast.grad_fn is None
    np.testing.assert_array_equal(fast.numpy(), base.numpy()[i])
    assert np.shares_memory(fast._data, base._data) == (base._data.size > 0)


@pytest.mark.parametrize("name,i", [(n, i) for n, i in _cases()
                                    if n not in ("expand", "bool")])
def test_in_place_through_an_int_view_bumps_both_and_writes_through(name, i):
    """A view of any layout, updated in place: both see it, both versions move together,
    exactly as through the general path's view."""
    results = []
    for how in ("int", "tuple"):
        base = dict(_bases())[name]
        v0 = base._version
        view = base[i] if how == "int" else base[(i,)]
        view.add_(3)
        view.mul_(2)
        results.append((base.numpy().copy(), view.numpy().copy(), base._version - v0,
                        view._version, view._version == base._version))
    (b1, v1, d1, w1, s1), (b2, v2, d2, w2, s2) = results
    np.testing.assert_array_equal(b1, b2)
    np.testing.assert_array_equal(v1, v2)
    assert (d1, w1, s1) == (d2, w2, s2)
    if b1.size:
        np.testing.assert_array_equal(b1[i], v1)  # (written through to the base)
        assert d1 == 2 and s1


def test_int_view_of_a_read_only_expand_stays_read_only():
    for how in ("int", "tuple"):
        base = hn.tensor(_arr((1, 3), 0)).expand(4, 3)
        view = base[1] if how == "int" else base[(1,)]
        assert not view._data.flags.writeable
        with pytest.raises(Exception) as info:
            view.add_(1.0)
        assert "read-only" in str(info.value) or "read only" in str(info.value)


@pytest.mark.parametrize("shape,i", [((3,), 3), ((3,), -4), ((3, 0), 3), ((0, 3), 0),
                                     ((0,), -1), ((2, 5), 2), ((2, 5), 2 ** 70),
                                     ((2, 5), -2 ** 70)])
def test_out_of_range_ints_raise_index_error_naming_dim_and_size(shape, i):
    t = hn.zeros(*shape)
    with pytest.raises(IndexError) as fast:
        t[i]
    with pytest.raises(IndexError) as general:
        t[(i,)]
    assert str(fast.value) == str(general.value)
    assert f"dim 0 with size {shape[0]}" in str(fast.value) and str(i) in str(fast.value)


def test_bool_and_0d_and_numpy_ints():
    t = hn.tensor(_arr((3, 2), 0))
    for b in (True, False, np.bool_(True)):
        with pytest.raises(IndexError, match="bool"):
            t[b]
    with pytest.raises(IndexError, match="too many indices"):
        hn.tensor(3.0)[0]
    for k in (np.int64(-1), np.int32(2), np.uint8(1)):
        np.testing.assert_array_equal(t[k].numpy(), t.numpy()[int(k)])
    # an int subclass other than bool takes the general path and agrees
    class MyInt(int):
        pass
    np.testing.assert_array_equal(t[MyInt(1)].numpy(), t[1].numpy())


def test_grad_mode_and_no_grad_on_a_tensor_that_requires_grad():
    w = hn.tensor(_arr((3, 4), 0), requires_grad=True)
    y = w[1]  # grad mode: recorded (not the short path)
    assert y.requires_grad and y.grad_fn is not None
    (y * y).sum().backward()
    want = np.zeros((3, 4), np.float32)
    want[1] = 2 * w.detach().numpy()[1]
    np.testing.assert_allclose(w.grad.numpy(), want)
    with hn.no_grad():
        z = w[-1]
    assert not z.requires_grad and z.is_leaf and z.grad_fn is None
    assert z._vc is w._vc


@pytest.mark.parametrize("how", ["int", "tuple"])
def test_no_grad_int_view_updated_in_place_before_backward_raises(how):
    """A view of a saved input, taken and updated under no_grad: backward raises as
    through the general path (and PyTorch)."""
    w = hn.tensor(_arr((3, 4), 0), requires_grad=True)
    loss = (w * w).sum()
    v0 = w._version
    with hn.no_grad():
        (w[2] if how == "int" else w[(2,)]).add_(1.0)
    assert w._version == v0 + 1
    with pytest.raises(RuntimeError, match="in-place"):
        loss.backward()


def test_recording_and_tracing_still_record_int_indexing():
    x = hn.tensor(_arr((4, 3), 0))
    with hn.record() as rec:
        y = x[2] * 2.0
        ops = [n.op for n in rec.graph.nodes]
    assert "slice" in ops, ops
    np.testing.assert_allclose(y.numpy(), x.numpy()[2] * 2)

    def f(x):
        return x[1] * 3.0 + x[-1]
    tf = hn.trace(f)
    for _ in range(3):
        with hn.no_grad():
            np.testing.assert_allclose(tf(x).numpy(), f(x).numpy(), rtol=1e-6)
    assert tf.stats.compiled_calls >= 1


# ---- the JIT against eager: a scenario run with T = identity and T = hn.trace ------------


def _err(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the type is the observation
        return ("raised", type(exc).__name__, "in-place" in str(exc))
    return ("ok",)


def _np(t):
    return None if t is None else np.array(t.detach().numpy(), copy=True)


def _compare(a, b, path="obs"):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), path
        assert a.shape == b.shape and a.dtype == b.dtype, path
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6, err_msg=path)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), (path, a, b)
        for k, (x, y) in enumerate(zip(a, b)):
            _compare(x, y, f"{path}[{k}]")
    else:
        assert a == b, (path, a, b)


def _twins(scenario, min_compiled=1):
    """Run scenario(jit) eagerly and traced; every observation must agree; the traced run
    must have run compiled calls (else it tested nothing)."""
    eager = scenario(lambda f: f)
    traced = []

    def jit(f):
        tf = hn.trace(f)
        traced.append(tf)
        return tf
    got = scenario(jit)
    _compare(eager, got)
    compiled = sum(tf.stats.compiled_calls for tf in traced)
    assert compiled >= min_compiled, [tf.stats.events for tf in traced]
    return eager, traced


def test_traced_function_indexing_an_int_argument():
    x = hn.tensor(_arr((5, 3), 0))

    def scenario(jit):
        f = jit(lambda x, i: x[i] * 2.0 + 1.0)
        obs = []
        for i in (0, 4, -1, -5, 2, 2, 2, -1, 0):
            with hn.no_grad():
                obs.append(_np(f(x, i)))
        for bad in (5, -6):
            obs.append(_err(lambda bad=bad: f(x, bad)))
        with hn.no_grad():
            obs.append(_np(f(x, 2)))
        return obs
    _twins(scenario, min_compiled=4)


def test_traced_loop_over_xs_t_with_changing_lengths_forward_and_backward():
    w0, u0 = _arr((3, 3), 1) * 0.5, _arr((3, 3), 2) * 0.5

    def f(xs, w, u):
        h = hn.zeros(2, 3)
        for t in range(xs.shape[0]):
            h = hn.tanh(xs[t] @ w + h @ u)
        return h + xs[-1] * 2.0 + xs[-2] - xs[1]

    def scenario(jit):
        tf = jit(f)
        w, u = hn.tensor(w0, requires_grad=True), hn.tensor(u0, requires_grad=True)
        obs = []
        for k, n in enumerate((5, 6, 7, 8, 3, 12, 5, 9, 10)):  # (12: a probe)
            xs = hn.tensor(_arr((n, 2, 3), 10 + k), requires_grad=k % 2 == 0)
            out = tf(xs, w, u)
            (out * out).sum().backward()
            obs += [_np(out), _np(xs.grad), _np(w.grad), _np(u.grad), xs._version]
            with hn.no_grad():
                obs.append(_np(tf(xs.detach(), w, u)))
        return obs
    _twins(scenario, min_compiled=4)


def _rnn_scenario(mutate, rounds=3, steps=6):
    def scenario(jit):
        hn.manual_seed(0)
        cell = nn.RNNCell(4, 5)
        step = jit(cell)
        xs = hn.tensor(_arr((steps, 3, 4), 5))
        obs = []
        for r in range(rounds):
            cell.zero_grad()
            h = hn.zeros(3, 5)
            hs = []
            for t in range(steps):
                h = step(xs[t], h)
                hs.append(h)
            loss = (h * h).sum()
            if r == rounds - 1 and mutate is not None:
                mutate(xs, hs, cell)
            obs.append(_err(loss.backward))
            obs += [xs._version, [hh._version for hh in hs]]
            # (after a backward that raised, which leaves got their gradient first
            # depends on the walk's order: eager's topological walk may have finished a
            # weight before it met the modified value, the call's single node has not)
            obs += [_np(p.grad) if obs[-3] == ("ok",) else "-" for p in cell.parameters()]
            obs += [_np(p) for p in cell.parameters()]
        return obs
    return scenario


def _no_grad(fn):
    def run(xs, hs, cell):
        with hn.no_grad():
            fn(xs, hs, cell)
    return run


MUTATIONS = {
    "none": None,
    "xs_base": _no_grad(lambda xs, hs, c: xs.add_(1.0)),
    "xs_row_used_last": _no_grad(lambda xs, hs, c: xs[5].mul_(2.0)),
    "xs_row_used_first": _no_grad(lambda xs, hs, c: xs[0].mul_(2.0)),
    "xs_slice": _no_grad(lambda xs, hs, c: xs[2:4].zero_()),
    "h_mid": _no_grad(lambda xs, hs, c: hs[2].mul_(2.0)),
    "h_last": _no_grad(lambda xs, hs, c: hs[-1].mul_(2.0)),
    "h_row_view": _no_grad(lambda xs, hs, c: hs[3][1].add_(1.0)),
    "weight_ih": _no_grad(lambda xs, hs, c: c.weight_ih.add_(1.0)),
    "weight_hh": _no_grad(lambda xs, hs, c: c.weight_hh[0].add_(1.0)),
    "bias_hh": _no_grad(lambda xs, hs, c: c.bias_hh.add_(1.0)),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_traced_rnn_cell_loop_in_place_before_backward_matches_eager(name):
    eager, _ = _twins(_rnn_scenario(MUTATIONS[name]), min_compiled=8)
    raised = eager[-1 - 2 * 4 - 2]
    if name in ("none", "bias_hh"):
        assert raised == ("ok",)
    else:  # (the scenario does test the error path)
        assert raised == ("raised", "RuntimeError", True), raised


def test_traced_cell_with_0d_and_1d_int_views_as_arguments():
    """x[t] of a 1-d tensor is a 0-d view; of a non-contiguous base, a strided view
    (hn_call refuses it: the checked path)."""
    def f(s, h, w):
        return hn.tanh(h @ w * s + h)

    def scenario(jit):
        tf = jit(f)
        w = hn.tensor(_arr((4, 4), 0) * 0.3, requires_grad=True)
        scalars = hn.tensor(_arr((7,), 1))
        rows = hn.tensor(_arr((4, 8, 3), 2)).permute(1, 2, 0)  # rows[t]: (3, 4) strided
        obs = []
        for _ in range(2):
            h = hn.tensor(_arr((3, 4), 3))
            for t in range(7):
                h = tf(scalars[t], h + rows[t], w)
            (h.sum()).backward()
            obs += [_np(h), _np(w.grad), scalars._version, rows._version]
            w.grad = None
        with hn.no_grad():
            rows[1].mul_(0.5)
            scalars[-1].add_(2.0)
        obs += [scalars._version, rows._version, _np(rows), _np(scalars)]
        return obs
    _twins(scenario, min_compiled=8)


def test_create_graph_through_a_traced_call():
    def f(x, w):
        return hn.tanh(x @ w) * x.sum()

    def scenario(jit):
        tf = jit(f)
        w = hn.tensor(_arr((3, 2), 0), requires_grad=True)
        obs = []
        for k in range(3):
            xs = hn.tensor(_arr((5, 4, 3), 1 + k), requires_grad=True)
            x = xs[k]  # (grad mode: the general path)
            y = tf(x, w)
            (g,) = hn.grad((y * y).sum(), [w], create_graph=True)
            obs.append(_np(g))
            (g * g).sum().backward()
            obs += [_np(w.grad), _np(xs.grad)]
            w.grad = None
        # an input modified in place between the call and a create_graph backward
        xs = hn.tensor(_arr((5, 4, 3), 9))
        y = tf(xs[1], w)
        with hn.no_grad():
            xs[1].add_(1.0)
        obs.append(_err(lambda: hn.grad(y.sum(), [w], create_graph=True)))
        obs.append(xs._version)
        return obs
    eager, _ = _twins(scenario, min_compiled=2)
    assert eager[-2][0] == "raised"


def test_traced_call_returning_a_view_of_its_input():
    def f(x, w):
        return x[1], x @ w, x.t()

    def scenario(jit):
        tf = jit(f)
        w = hn.tensor(_arr((3, 3), 0), requires_grad=True)
        obs = []
        for k in range(4):
            x = hn.tensor(_arr((3, 3), 1 + k), requires_grad=True)
            v, m, tr = tf(x, w)
            obs += [v.requires_grad, v.is_leaf, v._version == x._version,
                    np.shares_memory(v._data, x._data), np.shares_memory(tr._data, x._data)]
            obs.append(_err(lambda v=v: v.add_(1.0)))  # a view of a leaf that requires grad
            (v.sum() * 3 + (m * m).sum() + (tr * tr[0]).sum()).backward()
            obs += [_np(x.grad), _np(w.grad), x._version]
            w.grad = None
        # no grad for x: the view result is a plain view; update it in place, then the
        # backward through m (which saved x) must raise
        x = hn.tensor(_arr((3, 3), 7))
        v, m, tr = tf(x, w)
        with hn.no_grad():
            v.mul_(2.0)
        obs += [x._version, v._version, _np(x)]
        obs.append(_err(lambda: m.sum().backward()))
        return obs
    eager, _ = _twins(scenario, min_compiled=2)
    assert eager[-1][0] == "raised"


def test_several_calls_then_one_backward_using_some_outputs():
    def f(x, w, b):
        a = hn.tanh(x @ w + b)
        return a, (a * x.sum()).exp(), a.sum()

    def scenario(jit):
        tf = jit(f)
        w = hn.tensor(_arr((4, 4), 0) * 0.3, requires_grad=True)
        b = hn.tensor(_arr((4,), 1) * 0.1, requires_grad=True)
        xs = hn.tensor(_arr((5, 2, 4), 2) * 0.3)
        obs = []
        for r in range(3):
            outs = [tf(xs[t], w, b) for t in range(5)]
            loss = outs[0][0].sum() + outs[2][1].mean() + outs[4][2] + outs[3][1][0, 1]
            if r == 1:
                loss.backward(retain_graph=True)
                obs.append(_np(w.grad))
            if r == 2:  # a result whose buffer the backward reads (exp) modified
                with hn.no_grad():
                    outs[2][1].add_(1.0)
            obs.append(_err(loss.backward))
            obs += [_np(w.grad), _np(b.grad), xs._version]
            obs.append(_err(loss.backward))  # (second backward: freed)
            w.grad = b.grad = None
        return obs
    eager, _ = _twins(scenario, min_compiled=10)
    assert eager[-5] == ("raised", "RuntimeError", True)


def test_traced_function_updating_its_int_view_argument_in_place():
    def f(x, w):
        x.mul_(2.0)
        return x @ w

    def scenario(jit):
        tf = jit(f)
        w = hn.tensor(_arr((3, 3), 0))
        xs = hn.tensor(_arr((6, 2, 3), 1))
        obs = []
        with hn.no_grad():
            for t in range(6):
                obs.append(_np(tf(xs[t], w)))
                obs.append(xs._version)
            obs.append(_np(tf(xs[-1], w)))  # (again: the same row twice)
            obs.append(_np(xs))
            obs.append(xs._version)
        return obs
    _twins(scenario, min_compiled=3)


def test_int_view_updated_in_place_with_a_tensor_that_requires_grad():
    """x[i] of a plain tensor (no history either way), then row.add_(w) in grad mode:
    the same requires_grad, history and gradients as through the general path."""
    seen = []
    for how in ("int", "tuple"):
        x = hn.tensor(_arr((3, 4), 0))
        w = hn.tensor(_arr((4,), 1), requires_grad=True)
        row = x[1] if how == "int" else x[(1,)]
        row.add_(w)
        (row * row).sum().backward()
        seen.append((row.requires_grad, row.is_leaf, x.requires_grad, x._version,
                     row._version, _np(x), _np(w.grad)))
    _compare(seen[0], seen[1])
    assert seen[0][0] and seen[0][3] == 1


def test_captured_int_view_read_afresh_by_a_traced_function():
    def scenario(jit):
        xs = hn.tensor(_arr((5, 3), 0))
        box = {"row": xs[2]}
        row = box["row"]
        f = jit(lambda w: (row @ w).tanh() + row.sum())
        w = hn.tensor(_arr((3, 2), 1))
        obs = []
        with hn.no_grad():
            for _ in range(3):
                obs.append(_np(f(w)))
            xs.mul_(0.5)        # through the base: the view's values change
            obs.append(_np(f(w)))
            xs[2].add_(1.0)     # through another int view of the same row
            obs.append(_np(f(w)))
            row.sub_(2.0)
            obs += [_np(f(w)), xs._version, row._version]
        return obs
    _twins(scenario, min_compiled=3)


def test_traced_loop_with_fixed_int_reads_at_lengths_too_short_raises_as_eager():
    def f(xs, w):
        h = hn.zeros(2, 3)
        for t in range(xs.shape[0]):
            h = hn.tanh(xs[t] @ w + h)
        return h + xs[3] - xs[-4]

    def scenario(jit):
        tf = jit(f)
        w = hn.tensor(_arr((3, 3), 0) * 0.5)
        obs = []
        for n in (6, 7, 8, 9, 12, 4, 5, 3, 2, 10, 1, 6):
            xs = hn.tensor(_arr((n, 2, 3), n))
            with hn.no_grad():
                obs.append(_err(lambda xs=xs: tf(xs, w)))
                if obs[-1] == ("ok",):
                    obs.append(_np(tf(xs, w)))
        return obs
    eager, _ = _twins(scenario, min_compiled=6)
    assert ("raised", "IndexError", False) in [o for o in eager if isinstance(o, tuple)]


def test_list_of_int_views_as_a_traced_argument_then_in_place_before_backward():
    """Items xs[i] (views sharing xs's version counter) packed into one array by the
    trace: an in-place update of the base, an item or another row before backward()
    raises as eagerly."""
    def f(items, w):
        h = hn.zeros(2, 3)
        for x in items:
            h = hn.tanh(x @ w + h)
        return h

    mutations = [None, lambda xs, it: xs.add_(1.0), lambda xs, it: it[1].mul_(2.0),
                 lambda xs, it: xs[6].mul_(2.0)]

    def scenario(jit):
        obs = []
        for m, mutate in enumerate(mutations):
            tf = jit(f)
            w = hn.tensor(_arr((3, 3), 0) * 0.5, requires_grad=True)
            for k in range(4):
                xs = hn.tensor(_arr((7, 2, 3), 10 * m + k))
                items = [xs[i] for i in range(4 + k % 2)]
                h = tf(items, w)
                if k == 3 and mutate is not None:
                    with hn.no_grad():
                        mutate(xs, items)
                obs.append(_err(h.sum().backward))
                obs += [_np(w.grad) if obs[-1] == ("ok",) else "-", xs._version]
                w.grad = None
        return obs
    eager, _ = _twins(scenario, min_compiled=4)
    assert [o for o in eager if isinstance(o, tuple)].count(("raised", "RuntimeError", True)) == 3


def test_a_result_the_eager_backward_saved_updated_in_place_raises_traced_too():
    """tanh saves its output (eagerly, and in PyTorch): updating the traced call's tanh
    result in place before backward() must raise as eager does. (Found here: the
    compiled backward reads 1 - tanh**2, a buffer of its own, so nothing checks the
    result's version and backward() silently succeeds. Not caused by the reviewed
    commits: the pre-change CallRecord.attach behaves the same.)"""
    def g(x, w):
        t = hn.tanh(w)
        return t, (t * x).sum()

    def scenario(jit):
        tf = jit(g)
        obs = []
        for k in range(3):
            x = hn.tensor(_arr((2, 3), k))
            w = hn.tensor(_arr((2, 3), 5 + k), requires_grad=True)
            t, loss = tf(x, w)
            if k == 2:
                with hn.no_grad():
                    t.add_(1.0)
            obs.append(_err(loss.backward))
            obs.append(t._version)
        return obs
    eager, _ = _twins(scenario, min_compiled=1)
    assert eager[-2] == ("raised", "RuntimeError", True)


def test_create_graph_after_an_input_was_updated_in_place_raises_clearly():
    """(x + w) * 2: no eager vjp reads x, so updating x in place after the call does not
    stop a create_graph=True backward eagerly (nor in PyTorch). Through a traced call
    the create_graph replay re-runs the forward from the call's input arrays (which
    alias the updated x), so it refuses with a clear error instead of using the new
    values (docs/jit.md, Gradients): a documented difference, never a wrong answer."""
    def f(x, w):
        return (x + w) * 2.0

    def scenario(jit):
        tf = jit(f)
        obs = []
        for k in range(3):
            x = hn.tensor(np.full((2, 3), float(k), np.float32))
            w = hn.tensor(_arr((2, 3), k), requires_grad=True)
            y = tf(x, w)
            if k == 2:
                with hn.no_grad():
                    x.add_(1.0)
            try:
                (g,) = hn.grad((y * y).sum(), [w], create_graph=True)
                obs.append(("ok", _np(g)))
            except RuntimeError as exc:
                obs.append(("raised", str(exc)))
        return obs
    eager = scenario(lambda f: f)
    traced = scenario(hn.trace)
    assert [o[0] for o in eager] == ["ok", "ok", "ok"]
    assert [o[0] for o in traced] == ["ok", "ok", "raised"]
    assert "create_graph=True replays the call's forward" in traced[2][1]
    np.testing.assert_allclose(traced[1][1], eager[1][1], rtol=1e-6)


def test_kernels_on_a_recycled_heap_read_no_uninitialized_memory():
    """With glibc's thresholds raised (runtime/heap.py) blocks of 128 KiB..32 MiB come
    back from the heap unzeroed instead of fresh from mmap: fill freed blocks with NaN
    before every call, then compiled results (forward and backward, loops, products,
    reductions, large arenas) must still equal eager's."""
    from runtime import heap
    assert heap.tuned()

    def poison():
        junk = []
        for n in (1 << 17, 1 << 18, 1 << 19, 1 << 20, 3 << 20, 1 << 22, 1 << 23):
            for _ in range(2):
                a = np.empty(n // 4, np.float32)
                a.fill(np.nan)
                junk.append(a)
        del junk

    def rnn(xs, w, u):
        h = hn.zeros(64, 128)
        for t in range(xs.shape[0]):
            h = hn.tanh(xs[t] @ w + h @ u)
        return h

    cases = [
        (lambda x, w1, w2: hn.softmax(hn.tanh(x @ w1) @ w2, 1).sum(0),
         [((256, 300), False, 1.0), ((300, 200), True, 0.05), ((200, 100), True, 0.05)]),
        (lambda x, g: nn.functional.layer_norm(x, (600,), g) * 2.0,
         [((300, 600), True, 1.0), ((600,), True, 1.0)]),
        (lambda a, b: hn.cat([a.exp(), b * 2.0], 0).sum(1) + a.mean(),
         [((200, 300), False, 1.0), ((300, 300), False, 1.0)]),
        (rnn, [((8, 64, 128), False, 1.0), ((128, 128), True, 0.05), ((128, 128), True, 0.05)]),
    ]
    for n, (f, specs) in enumerate(cases):
        tf = hn.trace(f)
        args = [hn.tensor(_arr(shape, 100 * n + k) * scale, requires_grad=rg)
                for k, (shape, rg, scale) in enumerate(specs)]
        results = {}
        for name, fn in (("traced", tf), ("traced", tf), ("traced", tf), ("eager", f)):
            poison()
            out = fn(*args)
            grads = []
            if out.requires_grad:
                poison()
                (out * out).sum().backward()
                grads = [_np(a.grad) for a in args if a.requires_grad]
                for a in args:
                    a.grad = None
            results[name] = [_np(out)] + grads
        assert tf.stats.compiled_calls >= 2, tf.stats.events
        for a, b in zip(results["eager"], results["traced"]):
            assert not np.isnan(b).any()
            np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-5)


# ---- heap and LSR: the same work in fresh processes, other settings, same bits ----------


TRAIN = r"""
import hashlib, sys
import numpy as np
import hybridnet as hn
from hybridnet import nn
from hybridnet.cli_bench import training_step
from runtime import heap
hn.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
opt = hn.optim.Adam(model.parameters(), lr=1e-2)
rng = np.random.default_rng(1)
x = hn.tensor(rng.standard_normal((32, 8)).astype(np.float32))
y = hn.tensor(rng.integers(0, 3, 32))

step = hn.trace(training_step(model, opt))

cell = hn.trace(nn.RNNCell(8, 6))
xs = hn.randn(5, 4, 8)
h = hn.zeros(4, 6)
for t in range(5):
    h = cell(xs[t], h)
(h * h).sum().backward()
losses = [step(x, y).item() for _ in range(25)]
digest = hashlib.sha256()
for p in list(model.parameters()) + list(cell.parameters()):
    digest.update(p.detach().numpy().tobytes())
    digest.update(p.grad.numpy().tobytes())
digest.update(np.array(losses).tobytes())
digest.update(h.detach().numpy().tobytes())
print(heap.tuned(), step.stats.compiled_calls, digest.hexdigest())
"""


def _child(code, **env_over):
    env = dict(os.environ, PYTHONPATH=ROOT)
    for k in ("HYBRIDNET_MALLOC", "HYBRIDNET_LLVM_LSR"):
        env.pop(k, None)
    env["HYBRIDNET_CACHE_DIR"] = tempfile.mkdtemp(prefix="hn-overhead-adv-")
    env.update(env_over)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()


def test_malloc_setting_gives_bit_identical_training():
    tuned, compiled, digest = _child(TRAIN)
    off, compiled_off, digest_off = _child(TRAIN, HYBRIDNET_MALLOC="default")
    assert (tuned, off) == ("True", "False")
    assert int(compiled) >= 20 and compiled == compiled_off
    assert digest == digest_off


LSR = r"""
import hashlib
import numpy as np
import hybridnet as hn
from runtime import llvm_engine
rng = np.random.default_rng(0)
def T(shape, seed):
    return hn.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))
fns = [
    (lambda x: hn.softmax(x * 1.5, 1) + x.sum(0), [T((33, 17), 1)]),
    (lambda x, y: (x[:, ::3] * y[::2]).relu().sum(1), [T((9, 31), 2), T((17, 11), 3)]),
    (lambda x: hn.gelu(x.permute(1, 0)) + x.mean(), [T((45, 23), 4)]),
    (lambda x, w: hn.tanh(x @ w) @ w.t(), [T((7, 13), 5), T((13, 29), 6)]),
    (lambda x: (x.exp() * x[1:].sum(0)).sigmoid() + x[-1], [T((6, 5, 4), 7)]),
]
def loop(xs, w, u):
    h = hn.zeros(3, 8)
    for t in range(xs.shape[0]):
        h = hn.tanh(xs[t] @ w + h @ u)
    return h
fns.append((loop, [T((9, 3, 8), 8), T((8, 8), 9), T((8, 8), 10)]))
digest = hashlib.sha256()
compiled = 0
for f, args in fns:
    tf = hn.trace(f)
    with hn.no_grad():
        for _ in range(3):
            out = tf(*args)
    digest.update(out.numpy().tobytes())
    compiled += tf.stats.compiled_calls
# gradients through a traced cell too (the backward kernel)
cell = hn.trace(hn.nn.RNNCell(8, 8))
hn.manual_seed(0)
for p in cell.parameters():
    with hn.no_grad():
        p.copy_(T(p.shape, 11))
xs = T((6, 3, 8), 12)
for _ in range(2):
    h = hn.zeros(3, 8)
    for t in range(6):
        h = cell(xs[t], h)
    (h * h).sum().backward()
for p in cell.parameters():
    digest.update(p.grad.numpy().tobytes())
print(llvm_engine.strength_reduction(), compiled, digest.hexdigest())
"""


def test_strength_reduction_switch_gives_bit_identical_kernels():
    lsr_off = _child(LSR)
    lsr_on = _child(LSR, HYBRIDNET_LLVM_LSR="1")
    assert lsr_off[0] == "False" and lsr_on[0] == "True"
    assert int(lsr_off[1]) >= 6 and lsr_off[1] == lsr_on[1]
    assert lsr_off[2] == lsr_on[2]


# A loop whose machine code LSR changes; its assembly must be the same before and after
# hybridnet compiled a kernel in the process (the option is put back for everyone else).
RESTORE = r"""
import llvmlite.binding as llvm
import numpy as np
import hybridnet as hn
from runtime import llvm_engine
IR = '''
define void @f(float* noalias %a, float* noalias %b, i64 %n, i64 %s) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %j = mul i64 %i, %s
  %pa = getelementptr float, float* %a, i64 %j
  %k = mul i64 %i, 3
  %pb = getelementptr float, float* %b, i64 %k
  %va = load float, float* %pa
  %vb = load float, float* %pb
  %v = fadd float %va, %vb
  store float %v, float* %pa
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %n
  br i1 %c, label %loop, label %done
done:
  ret void
}
'''
llvm.initialize_native_target()
llvm.initialize_native_asmprinter()
tm = llvm.Target.from_default_triple().create_target_machine(opt=3)
def asm():
    m = llvm.parse_assembly(IR)
    m.verify()
    return tm.emit_assembly(m)
before = asm()
f = hn.trace(lambda x: (x * 2.0).sum(1))
x = hn.randn(20, 30)
with hn.no_grad():
    f(x); f(x)
assert f.stats.compiled_calls == 1
after = asm()
llvm.set_option("", "-disable-lsr=true")
without = asm()
llvm.set_option("", "-disable-lsr=false")
print(before == after, before != without)
"""


def test_llvm_option_is_put_back_for_other_llvm_users():
    assert _child(RESTORE) == ["True", "True"]


def test_llvm_option_set_by_the_user_is_put_back_to_llvms_default():
    """llvmlite cannot read an LLVM option, so a compile puts -disable-lsr back to LLVM's
    default (false) rather than to what another user of LLVM in the process set: a
    documented limitation (runtime/llvm_engine._emit_object); code stays correct, only
    that user's later loops get strength reduction again."""
    code = RESTORE.replace(
        "before = asm()\n",
        "before = asm()\nllvm.set_option('', '-disable-lsr=true')\nuser = asm()\n").replace(
        "after = asm()\n", "after = asm()\nprint(user != before, after == before)\n")
    out = _child(code)
    assert out[0] == "True"  # (the user's setting does change this loop's code)
    assert out[1] == "True"  # (after a hybridnet compile: LLVM's default again)
