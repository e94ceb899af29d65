"""Edge cases: extreme values, 0-d and size-0 tensors, dtype promotion, type errors,
in-place safety; plus property tests (hypothesis) for reductions, indexing and dtypes."""

import math

import numpy as np
import pytest
import scipy.special as sp
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from oracles import R, check_forward, check_grad, check_interpreted, seed_of

import hybridnet as hn
from compiler.dtypes import SUPPORTED
from compiler.errors import DTypeError, OpError, ShapeError

INF, NAN = math.inf, math.nan
FLOATS = [hn.float32, hn.float64]

# ---- extreme values: no nan where the math has none -------------------------------------

STABLE = [
    ("softmax-large", lambda x: x.softmax(-1), lambda a: sp.softmax(a, -1),
     [[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [1e4, 1e4, 1e4]], True),
    ("log_softmax-large", lambda x: x.log_softmax(-1), lambda a: sp.log_softmax(a, -1),
     [[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]], True),
    ("logsumexp-large", lambda x: x.logsumexp(-1), lambda a: sp.logsumexp(a, -1),
     [[1e4, 1e4, 0.0], [-1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]], True),
    ("logsumexp-dim0-large", lambda x: hn.logsumexp(x, 0), lambda a: sp.logsumexp(a, 0),
     [[1e4, -1e4], [1e4, -1e4]], True),
    ("softmax-ninf-entries", lambda x: x.softmax(1), lambda a: sp.softmax(a, 1),
     [[-INF, 0.0, 1.0], [2.0, -INF, -INF]], True),
    ("log_softmax-ninf-entries", lambda x: x.log_softmax(1), lambda a: sp.log_softmax(a, 1),
     [[-INF, 0.0, 1.0]], False),
    ("logsumexp-all-ninf-row", lambda x: x.logsumexp(1), lambda a: sp.logsumexp(a, 1),
     [[-INF, -INF, -INF], [-INF, 0.0, 1.0]], False),
    ("logsumexp-inf", lambda x: x.logsumexp(1), lambda a: np.array([INF, 2.0]),
     [[INF, 0.0, 1.0], [2.0, -INF, -INF]], False),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name,fn,ref,values,grad", STABLE, ids=[s[0] for s in STABLE])
def test_stable_at_extreme_values(name, fn, ref, values, grad, dtype):
    with np.errstate(all="ignore"):
        expected = ref(np.array(values, dtype=np.float64))
    x = hn.tensor(values, dtype=dtype, requires_grad=True)
    out = fn(x)
    assert not np.isnan(out._data).any(), out
    np.testing.assert_allclose(out._data, expected, rtol=1e-6)
    if grad:
        (g,) = hn.grad(out, x, grad_outputs=hn.ones(*out.shape, dtype=dtype))
        assert np.isfinite(g._data).all(), g


SPECIAL = [  # (name, fn, input, the mathematically defined result)
    ("log-0", hn.log, 0.0, -INF), ("log-neg", hn.log, -1.0, NAN), ("log-inf", hn.log, INF, INF),
    ("exp-overflow", hn.exp, 1000.0, INF), ("exp-underflow", hn.exp, -1000.0, 0.0),
    ("sqrt-neg", hn.sqrt, -1.0, NAN), ("rsqrt-0", hn.rsqrt, 0.0, INF),
    ("reciprocal-0", hn.reciprocal, 0.0, INF), ("div-by-0", lambda t: t / 0.0, 1.0, INF),
    ("neg-div-by-0", lambda t: -t / 0.0, 1.0, -INF), ("0-div-0", lambda t: t / 0.0, 0.0, NAN),
    ("sigmoid-ninf", hn.sigmoid, -INF, 0.0), ("sigmoid-inf", hn.sigmoid, INF, 1.0),
    ("sigmoid-huge", hn.sigmoid, -1e4, 0.0), ("tanh-inf", hn.tanh, INF, 1.0),
    ("relu-ninf", hn.relu, -INF, 0.0), ("exp-ninf", hn.exp, -INF, 0.0),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name,fn,value,expected", SPECIAL, ids=[s[0] for s in SPECIAL])
def test_special_values_without_exceptions(name, fn, value, expected, dtype):
    with np.errstate(all="ignore"):
        out = fn(hn.tensor([value, value], dtype=dtype))
    assert out.dtype == dtype
    np.testing.assert_array_equal(out._data, np.array([expected, expected]))


def test_gradient_of_log_at_zero_is_inf():
    x = hn.tensor([0.0, 2.0], requires_grad=True)
    with np.errstate(all="ignore"):
        (g,) = hn.grad(hn.log(x).sum(), x)
    np.testing.assert_array_equal(g._data, [INF, 0.5])


# ---- 0-d tensors everywhere --------------------------------------------------------------

ZERO_D = [  # (name, fn, float64 reference); each checked three ways on a 0-d input
    ("exp", lambda x: x.exp(), np.exp), ("gelu", hn.gelu, lambda x: x / 2 * (1 + sp.erf(
        x / math.sqrt(2)))), ("arith", lambda x: 2 - x * x / 3, lambda x: 2 - x * x / 3),
    ("clamp", lambda x: x.clamp(-0.1, 0.1), lambda x: np.clip(x, -0.1, 0.1)),
    ("where", lambda x: hn.where(x > 0, x, -x), np.abs),
    ("sum", lambda x: x.sum(), np.sum), ("sum-dim0", lambda x: x.sum(0), np.sum),
    ("sum-neg-keep", lambda x: x.sum(-1, keepdim=True), np.sum),
    ("mean", lambda x: x.mean(0), np.mean), ("amax", lambda x: x.amax(), np.max),
    ("amin-dim", lambda x: x.amin(-1), np.min), ("max", lambda x: x.max(), np.max),
    ("max-dim", lambda x: x.max(0), lambda x: (x, np.int64(0))),
    ("min-dim-keep", lambda x: x.min(-1, keepdim=True), lambda x: (x, np.int64(0))),
    ("logsumexp", lambda x: x.logsumexp(0), lambda x: x),
    ("softmax", lambda x: x.softmax(-1), np.ones_like),
    ("log_softmax", lambda x: x.log_softmax(0), np.zeros_like),
    ("var-correction0", lambda x: x.var(correction=0), lambda x: np.float64(0.0)),
    ("unsqueeze", lambda x: x.unsqueeze(-1), lambda x: x.reshape(1)),
    ("reshape", lambda x: x.reshape(1, 1), lambda x: x.reshape(1, 1)),
    ("flatten", lambda x: x.flatten(), lambda x: x.reshape(1)),
    ("squeeze", lambda x: x.squeeze(), lambda x: x), ("squeeze-0", lambda x: x.squeeze(0),
                                                        lambda x: x),
    ("expand", lambda x: x.expand(2, 3), lambda x: np.broadcast_to(x, (2, 3))),
    ("index-none", lambda x: x[None, ..., None], lambda x: x.reshape(1, 1)),
    ("stack", lambda x: hn.stack([x, x * 2]), lambda x: np.stack([x, x * 2])),
    ("mul-vector", lambda x: x * hn.arange(3, dtype=x.dtype), lambda x: x * np.arange(3.0)),
]


@pytest.mark.parametrize("name,fn,ref", ZERO_D, ids=[z[0] for z in ZERO_D])
def test_zero_dim_tensors(name, fn, ref):
    spec, seed = (R(()),), seed_of("0d-" + name)
    check_forward(fn, ref, spec, seed)
    check_grad(fn, spec, seed)
    check_interpreted(fn, spec, seed)


@pytest.mark.parametrize("fn,exc,match", [
    (lambda x: x @ x, ShapeError, "matmul"), (lambda x: hn.cat([x, x]), ShapeError, "cat"),
    (lambda x: len(x), TypeError, "0-d"), (lambda x: list(x), TypeError, "0-d"),
    (lambda x: x[0], IndexError, "too many indices"), (lambda x: x.sum(1), ShapeError, "sum"),
    (lambda x: x.chunk(2), ShapeError, "chunk"), (lambda x: x.argmax(1), ShapeError, "argmax"),
], ids=["matmul", "cat", "len", "iter", "index", "sum-dim1", "chunk", "argmax-dim1"])
def test_zero_dim_errors(fn, exc, match):
    with pytest.raises(exc, match=match):
        fn(hn.tensor(1.5))


def test_zero_dim_conversions():
    x = hn.tensor(2.5)
    assert x.shape == () and x.ndim == 0 and x.numel() == 1
    assert x.item() == 2.5 and x.tolist() == 2.5 and float(x) == 2.5
    assert hn.tensor(3).item() == 3 and int(hn.tensor(3)) == 3


# ---- reductions over size-0 dims ----------------------------------------------------------


def test_sum_over_size0_is_zero_and_has_a_gradient():
    x = hn.zeros(0, 3, requires_grad=True)
    np.testing.assert_array_equal(x.sum(0)._data, np.zeros(3, np.float32))
    assert x.sum().item() == 0.0 and x.sum().dtype == hn.float32
    assert hn.zeros(0, dtype=hn.bool).sum().dtype == hn.int64
    (g,) = hn.grad(x.sum(), x)
    assert g.shape == (0, 3)
    assert x.amax(1).shape == (0,)  # reducing a non-empty dim of an empty tensor is fine


@pytest.mark.parametrize("fn", [lambda x: x.mean(), lambda x: x.mean(0), lambda x: x.var(0),
                                lambda x: x.std()], ids=["mean", "mean-dim", "var", "std"])
def test_mean_var_over_size0_are_nan(fn):
    with np.errstate(all="ignore"):
        out = fn(hn.zeros(0, 3))
    assert out.numel() and np.isnan(out._data).all()


def test_softmax_logsumexp_over_size0():
    x = hn.zeros(3, 0)
    np.testing.assert_array_equal(hn.logsumexp(x, 1)._data, np.full(3, -INF, np.float32))
    assert x.softmax(1).shape == (3, 0) and x.log_softmax(-1).shape == (3, 0)


@pytest.mark.parametrize("fn", [lambda x: x.amax(), lambda x: x.amin(0), lambda x: x.max(),
                                lambda x: x.max(0), lambda x: x.min(dim=0),
                                lambda x: x.argmax(), lambda x: x.argmin(0)],
                         ids=["amax", "amin", "max", "max-dim", "min-dim", "argmax", "argmin"])
def test_extrema_over_size0_raise_a_clear_error(fn):
    with pytest.raises(ShapeError, match=r"(size-0|size 0|empty).*|.*\[0, 3\]"):
        fn(hn.zeros(0, 3))


# ---- dtype promotion, as PyTorch ---------------------------------------------------------

I64, I32 = hn.tensor([1, 2]), hn.tensor([3, 4], dtype=hn.int32)
F32, F64, B = hn.tensor([1.5, 2.5]), hn.tensor([0.5, 4.0], dtype=hn.float64), hn.tensor(
    [True, False])
PROMOTION = [
    ("int64+1.5", lambda: I64 + 1.5, hn.float32), ("int32+int64", lambda: I32 + I64, hn.int64),
    ("f32+0d-f64", lambda: F32 + hn.tensor(2.0, dtype=hn.float64), hn.float32),
    ("0d-f32+0d-f64", lambda: hn.tensor(1.0) + hn.tensor(2.0, dtype=hn.float64), hn.float64),
    ("f32+f64", lambda: F32 * F64, hn.float64), ("int/int", lambda: I64 / I64, hn.float32),
    ("int32/2", lambda: I32 / 2, hn.float32), ("bool+bool", lambda: B + B, hn.bool),
    ("bool*bool", lambda: B * B, hn.bool), ("bool+1", lambda: B + 1, hn.int64),
    ("bool+1.5", lambda: B + 1.5, hn.float32), ("int32+1", lambda: I32 + 1, hn.int32),
    ("int32+0d-int64", lambda: I32 + hn.tensor(7), hn.int32),
    ("int64+0d-f32", lambda: I64 + hn.tensor(0.5), hn.float32),
    ("int64+0d-f64", lambda: I64 - hn.tensor(0.5, dtype=hn.float64), hn.float64),
    ("f64+1.5", lambda: F64 + 1.5, hn.float64), ("int64*2.0", lambda: 2.0 * I64, hn.float32),
    ("int64**2", lambda: I64 ** 2, hn.int64), ("2**int64", lambda: 2 ** I64, hn.int64),
    ("bool**2", lambda: B ** 2, hn.int64), ("int64**0.5", lambda: I64 ** 0.5, hn.float32),
    ("exp-int", lambda: hn.exp(I64), hn.float32), ("sqrt-bool", lambda: B.sqrt(), hn.float32),
    ("sum-bool", lambda: B.sum(), hn.int64), ("sum-int32", lambda: I32.sum(), hn.int64),
    ("where-int-float", lambda: hn.where(B, I64, 0.5), hn.float32),
    ("where-scalars", lambda: hn.where(B, 1.0, 0.0), hn.float32),
    ("where-int-scalars", lambda: hn.where(B, 1, 0), hn.int64),
    ("cat-int-float", lambda: hn.cat([I64, F32]), hn.float32),
    ("maximum-int-f32", lambda: hn.maximum(I32, F32), hn.float32),
    ("matmul-int", lambda: I64 @ I64, hn.int64), ("softmax-int", lambda: I64.softmax(0),
                                                   hn.float32),
    ("lt", lambda: I64 < 1.5, hn.bool), ("eq-mixed", lambda: F32 == I64, hn.bool),
    ("ne-bool", lambda: B != B, hn.bool), ("ge-f64", lambda: F64 >= F32, hn.bool),
]


@pytest.mark.parametrize("name,fn,dtype", PROMOTION, ids=[p[0] for p in PROMOTION])
def test_dtype_promotion_as_pytorch(name, fn, dtype):
    out = fn()
    assert out.dtype == dtype, f"{name}: got {out.dtype}, PyTorch gives {dtype}"
    assert out._data.dtype == dtype.np


def test_promoted_values_are_computed_in_the_promoted_dtype():
    np.testing.assert_array_equal((I64 + 1.5)._data, np.array([2.5, 3.5], np.float32))
    np.testing.assert_array_equal((I64 / I64)._data, np.ones(2, np.float32))
    np.testing.assert_array_equal((B + B)._data, [True, False])


@pytest.mark.parametrize("fn,exc,match", [
    (lambda: -B, DTypeError, "neg"), (lambda: B - B, DTypeError, "sub"),
    (lambda: B ** B, DTypeError, "pow"), (lambda: B @ B, DTypeError, "matmul"),
    (lambda: I64.mean(), DTypeError, "mean"), (lambda: I64.var(), DTypeError, "var"),
    (lambda: I64.logsumexp(0), DTypeError, "logsumexp"),
    (lambda: hn.where(F32, F32, F32), DTypeError, "where"),
    (lambda: I64.requires_grad_(), RuntimeError, "floating-point"),
    (lambda: F32[hn.tensor([0.0])], IndexError, "integer or bool"),
    (lambda: ~F32, TypeError, "bool"), (lambda: F32 & F32, TypeError, "bool"),
    (lambda: F32 + hn.ones(3), ShapeError, r"add.*\[2\].*\[3\]"),
    (lambda: hn.ones(2, 3) @ hn.ones(2, 3), ShapeError, r"matmul.*\[2, 3\]"),
    (lambda: hn.ones(2, 3).reshape(4, -1), ShapeError, "reshape"),
    (lambda: hn.ones(2, 3).sum(2), ShapeError, "out of range"),
    (lambda: F32.softmax(), TypeError, "dim"),
], ids=["neg-bool", "sub-bool", "pow-bool", "matmul-bool", "mean-int", "var-int",
        "logsumexp-int", "where-float-cond", "int-requires-grad", "float-index", "invert-float",
        "and-float", "add-shapes", "matmul-shapes", "reshape", "dim-range", "softmax-no-dim"])
def test_type_and_shape_errors_are_clear(fn, exc, match):
    with pytest.raises(exc, match=match):
        fn()


def test_dtype_errors_are_both_type_and_op_errors():
    for kind in (TypeError, OpError):
        with pytest.raises(kind):
            hn.neg(B)


# ---- in place, setitem and autograd safety -------------------------------------------------


def test_setitem_under_no_grad_writes_through_to_numpy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x, ref = hn.from_numpy(a), a.copy()
    with hn.no_grad():
        x[0, 1:] = 5.0
        x[hn.tensor([2, 1]), -1] = hn.tensor([7.0, 8.0])
        x[x > 9.5] = 0.0
    ref[0, 1:] = 5.0
    ref[[2, 1], -1] = [7.0, 8.0]
    ref[ref > 9.5] = 0.0
    np.testing.assert_array_equal(a, ref)


def test_setitem_refuses_when_autograd_or_recording_is_involved():
    w = hn.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="no_grad"):
        w[0] = 2.0
    with pytest.raises(RuntimeError, match="record"):
        with hn.record():
            hn.ones(3)[0] = 2.0


def test_inplace_on_saved_value_raises_at_backward():
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    z = (y * y).sum()
    y.add_(1.0)
    with pytest.raises(RuntimeError, match="in-place"):
        z.backward()


def test_inplace_on_leaf_requires_no_grad_then_updates_shared_memory():
    a = np.array([1.0, 2.0], dtype=np.float32)
    w = hn.from_numpy(a).requires_grad_()
    with pytest.raises(RuntimeError, match="leaf"):
        w.sub_(1.0)
    with hn.no_grad():
        w.sub_(hn.tensor([0.5, 0.5]) * 2).mul_(3.0).clamp_(max=2.0)
    np.testing.assert_array_equal(a, np.minimum((np.array([1.0, 2.0]) - 1.0) * 3.0, 2.0))
    assert w.requires_grad and w.is_leaf


@pytest.mark.parametrize("record", [False, True], ids=["eager", "recorded"])
def test_inplace_dtype_rules_as_pytorch(record):
    with hn.no_grad(), (hn.record() if record else hn.no_grad()):
        with pytest.raises(DTypeError, match="add_"):
            hn.tensor([1, 2]).add_(1.5)
        with pytest.raises(DTypeError, match="div_"):
            hn.tensor([1, 2]).div_(2)
        with pytest.raises(ShapeError, match="add_"):
            hn.ones(2).add_(hn.ones(2, 2))  # self is never broadcast
        t = hn.tensor([1.0, 2.0]).add_(hn.tensor([0.5, 0.25], dtype=hn.float64))
        assert t.dtype == hn.float32 and t.tolist() == [1.5, 2.25]
        t = hn.tensor([1, 2]).copy_(hn.tensor([1.7, -1.7], dtype=hn.float64))
        assert t.dtype == hn.int64 and t.tolist() == [1, -1]  # truncation, as a C cast


def test_inplace_into_an_expanded_view_raises():
    with pytest.raises(RuntimeError, match="read-only"):
        hn.ones(3, 1).expand(3, 4).add_(1.0)


@pytest.mark.parametrize("overwrite", [lambda t: t.zero_(), lambda t: t.fill_(3.0),
                                       lambda t: t.copy_(hn.tensor([5.0, 6.0]))],
                         ids=["zero_", "fill_", "copy_-constant"])
def test_overwriting_a_tensor_in_place_cuts_its_gradient(overwrite):
    """As PyTorch: after y.zero_() the old history of y no longer reaches the loss."""
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    overwrite(y)
    (g,) = hn.grad(y.sum(), x, allow_unused=True)
    assert g is None or not g._data.any(), f"stale gradient {g} through overwritten history"


def test_detach_and_grad_of_an_input_itself():
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    (g,) = hn.grad((x.detach() * x).sum(), x)
    np.testing.assert_array_equal(g._data, [1.0, 2.0])
    (g,) = hn.grad(x, x, grad_outputs=hn.tensor([3.0, 4.0]))  # as torch.autograd.grad(x, x)
    np.testing.assert_array_equal(g._data, [3.0, 4.0])


# ---- properties --------------------------------------------------------------------------

_REDUCTIONS = {
    "sum": (lambda x, d, k: x.sum(d, keepdim=k), lambda a, d, k: a.sum(d, keepdims=k)),
    "mean": (lambda x, d, k: x.mean(d, keepdim=k), lambda a, d, k: a.mean(d, keepdims=k)),
    "amax": (lambda x, d, k: x.amax(d, keepdim=k), lambda a, d, k: a.max(d, keepdims=k)),
    "amin": (lambda x, d, k: hn.amin(x, d, k), lambda a, d, k: a.min(d, keepdims=k)),
    "logsumexp": (lambda x, d, k: x.logsumexp(d, k), lambda a, d, k: sp.logsumexp(a, d,
                                                                                  keepdims=k)),
    "var": (lambda x, d, k: x.var(d, keepdim=k, correction=0),
            lambda a, d, k: a.var(d, keepdims=k)),
}


@settings(max_examples=60, deadline=None, database=None)
@given(data=st.data(), op=st.sampled_from(sorted(_REDUCTIONS)), keepdim=st.booleans())
def test_reductions_match_numpy(data, op, keepdim):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3))
    dims = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, min_size=1))
    dims = tuple(d - len(shape) if data.draw(st.booleans()) else d for d in dims)
    dim = dims[0] if len(dims) == 1 and data.draw(st.booleans()) else dims
    a = np.random.default_rng(len(shape)).uniform(-2, 2, shape)
    ours, theirs = _REDUCTIONS[op]
    out = ours(hn.tensor(a), dim, keepdim)
    ref = theirs(a, dim, keepdim)
    assert out.shape == np.shape(ref) and out.dtype == hn.float64
    np.testing.assert_allclose(out._data, ref, rtol=1e-12, atol=1e-12)


def _positive_steps(index):
    items = index if isinstance(index, tuple) else (index,)
    return all(not isinstance(i, slice) or i.step is None or i.step > 0 for i in items)


@settings(max_examples=80, deadline=None, database=None)
@given(data=st.data(), shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
def test_basic_indexing_matches_numpy_and_scatters_gradients(data, shape):
    index = data.draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    assume(_positive_steps(index))  # negative steps raise, as in PyTorch
    a = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    x = hn.tensor(a, requires_grad=True)
    out = x[index]
    np.testing.assert_array_equal(out._data, a[index])
    w = np.random.default_rng(0).standard_normal(np.shape(a[index]))
    if out.grad_fn is not None:
        (g,) = hn.grad(out, x, grad_outputs=hn.tensor(w))
        expected = np.zeros(shape)
        expected[index] += w
        np.testing.assert_array_equal(g._data, expected)


_BINARY_API = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
               "div": lambda a, b: a / b, "pow": lambda a, b: a ** b, "matmul": hn.matmul,
               "maximum": hn.maximum, "lt": lambda a, b: a < b, "eq": lambda a, b: a == b}


@settings(max_examples=120, deadline=None, database=None)
@given(op=st.sampled_from(sorted(_BINARY_API)), da=st.sampled_from(SUPPORTED),
       db=st.sampled_from(SUPPORTED), zero_d=st.booleans())
def test_every_eager_result_satisfies_its_recorded_rule(op, da, db, zero_d):
    """Any dtype mix either raises a clear error or gives a supported dtype that the
    recorded graph's shape/dtype rules agree with (Graph.verify)."""
    a = hn.tensor(np.array([[1, 2], [0, 1]]).astype(da))
    b = hn.tensor(np.array(1 if zero_d else [[1, 0], [1, 1]]).astype(db))
    try:
        with hn.record():
            out = _BINARY_API[op](a, b)
            graph = hn.graph_of(out)
    except (TypeError, OpError):
        return
    assert out._data.dtype in SUPPORTED
    graph.verify()


@pytest.mark.parametrize("i", [0, 2, -1, -4])
def test_an_integer_index_is_the_same_view_recorded_or_not(i):
    """x[i] takes a short path when nothing records it; it must equal the recorded one:
    a view sharing x's version counter, a 0-d array for a 1-d x, and the same error."""
    base = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    for record in (False, True):
        x = hn.tensor(base.copy())
        if record:
            with hn.record():
                y = x[i]
        else:
            y = x[i]
        np.testing.assert_array_equal(y.numpy(), base[i])
        y.add_(1.0)
        assert x._version == y._version == 1
        np.testing.assert_array_equal(x.numpy()[i], base[i] + 1)
        v = hn.tensor(base[:, 0, 0].copy())[i]
        assert v.shape == () and type(v.numpy()) is np.ndarray
    with pytest.raises(IndexError, match="out of bounds for dim 0 with size 4"):
        hn.tensor(base)[4]
    w = hn.tensor(base, requires_grad=True)
    w[i].sum().backward()  # (requires grad: recorded, the gradient lands in row i)
    assert w.grad.numpy()[i].sum() == 6 and w.grad.numpy().sum() == 6
