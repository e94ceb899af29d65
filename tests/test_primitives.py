"""Every primitive in the registry, through `hybridnet.dispatch.apply`, checked against a
float64 NumPy reference, central finite differences and the reference interpreter.

`CASES` must hold at least one case per non-source primitive (test_registry checks it),
so adding an op without a test fails.
"""

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from oracles import (
    R,
    S,
    V,
    assert_matches_ref,
    check_forward,
    check_grad,
    check_interpreted,
    check_second_order,
    make_inputs,
    seed_of,
    to64,
    wrap,
)

import hybridnet as hn
from compiler.ops import REGISTRY, Trait
from hybridnet.dispatch import apply


@dataclass(frozen=True)
class P:
    """One primitive case: op, input specs, attrs; `grad=False` for int/bool-only cases."""

    op: str
    name: str
    inputs: tuple
    attrs: dict = field(default_factory=dict)
    grad: bool = True
    out_dtype: object = np.float32  # dtype of a float result from float32 inputs
    wrt: tuple = None  # inputs to differentiate (default: every float array)
    second: bool = True  # False where the second derivative is nan, as in PyTorch

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}"

    def fn(self, *xs):
        return apply(self.op, xs, self.attrs)

    def ref(self, *xs):
        return REFS[self.op](*xs, **self.attrs)


def _slices(index):
    return tuple(slice(*t) for t in index)


def _pad_slice_ref(x, shape, index):
    out = np.zeros(shape, x.dtype)
    out[_slices(index)] = x
    return out


def _scatter_add_ref(src, idx, dim, size):
    out = np.zeros(src.shape[:dim] + (size,) + src.shape[dim + idx.ndim:], src.dtype)
    for pos in np.ndindex(*idx.shape):
        lead = (slice(None),) * dim
        out[lead + (idx[pos],)] += src[lead + pos]
    return out


def _window_positions(shape, kernel, dilation, stride):
    """(n, i, j, c, p, q, row, col) of every window element, by plain loops."""
    n, oh, ow, c, kh, kw = shape
    for pos in np.ndindex(n, oh, ow, c, kh, kw):
        _, i, j, _, p, q = pos
        yield pos, i * stride[0] + p * dilation[0], j * stride[1] + q * dilation[1]


def _unfold_ref(x, kernel, dilation, stride):
    n, c, h, w = x.shape
    oh = (h - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    ow = (w - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    out = np.zeros((n, oh, ow, c) + tuple(kernel), x.dtype)
    for pos, row, col in _window_positions(out.shape, kernel, dilation, stride):
        out[pos] = x[pos[0], pos[3], row, col]
    return out


def _fold_ref(cols, size, kernel, dilation, stride):
    out = np.zeros((cols.shape[0], cols.shape[3]) + tuple(size), cols.dtype)
    for pos, row, col in _window_positions(cols.shape, kernel, dilation, stride):
        out[pos[0], pos[3], row, col] += cols[pos]
    return out


def _cumsum_ref(x, dim):
    out = np.array(x, copy=True)
    if x.ndim:
        for k in range(1, x.shape[dim]):  # a plain running sum, in order
            index = (slice(None),) * dim
            out[index + (k,)] = out[index + (k - 1,)] + x[index + (k,)]
    return out


def _argsort_ref(x, dim, descending):
    if not x.ndim:
        return np.zeros((), np.int64)
    moved = np.moveaxis(x, dim, -1)
    out = np.zeros(moved.shape, np.int64)
    for pos in np.ndindex(*moved.shape[:-1]):
        sign = -1 if descending else 1
        row = [sign * v for v in moved[pos]]
        out[pos] = sorted(range(len(row)), key=row.__getitem__)  # stable: ties by position
    return np.moveaxis(out, -1, dim)


REFS = {
    "cumsum": _cumsum_ref, "argsort": _argsort_ref,
    "unfold": _unfold_ref, "fold": _fold_ref,
    "neg": np.negative, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "sin": np.sin,
    "cos": np.cos, "tanh": np.tanh, "abs": np.abs,
    "sign": lambda x: np.sign(x) if x.dtype != bool else x,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(np.clip(-x, -700, 700))),
    "erf": lambda x: np.vectorize(math.erf, otypes=[np.float64])(x),
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "pow": np.power, "maximum": np.maximum, "minimum": np.minimum,
    "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "eq": np.equal, "ne": np.not_equal, "where": np.where,
    "cast": lambda x, dtype: np.asarray(x).astype(dtype),
    "sum": lambda x, dims, keepdim: np.sum(x, axis=dims, keepdims=keepdim),
    "max": lambda x, dims, keepdim: np.max(x, axis=dims, keepdims=keepdim),
    "min": lambda x, dims, keepdim: np.min(x, axis=dims, keepdims=keepdim),
    "argmax": lambda x, dim, keepdim: np.argmax(x, axis=dim, keepdims=keepdim).astype(np.int64),
    "argmin": lambda x, dim, keepdim: np.argmin(x, axis=dim, keepdims=keepdim).astype(np.int64),
    "reshape": lambda x, shape: np.reshape(x, shape),
    "permute": lambda x, dims: np.transpose(x, dims),
    "expand": lambda x, shape: np.broadcast_to(x, shape),
    "detach": lambda x: x,
    "slice": lambda x, index: x[_slices(index)],
    "pad_slice": _pad_slice_ref,
    "cat": lambda *xs, dim: np.concatenate(xs, axis=dim),
    "take": lambda x, idx, dim: x[(slice(None),) * dim + (idx,)],
    "scatter_add": _scatter_add_ref,
    "matmul": lambda a, b: np.einsum("...ij,...jk->...ik", a, b),
}

I64 = np.array([[3, -1, 0], [2, 5, -4]], dtype=np.int64)
I64B = np.array([2, -3, 1], dtype=np.int64)
BOOLS = np.array([[True, False, True], [False, False, True]])


def _unary(op, lo=-2.0, hi=2.0, away=0.0):
    def r(shape, layout="c"):
        return R(shape, lo, hi, layout, away)
    return [P(op, "2x3", (r((2, 3)),)), P(op, "0d", (r(()),)), P(op, "size0", (r((0, 3)),)),
            P(op, "size1", (r((1, 3, 1)),)), P(op, "T", (r((3, 2, 4), "T"),)),
            P(op, "step", (r((3, 2), "step"),)), P(op, "flip", (r((4,), "flip"),))]


def _binary(op, lo=-2.0, hi=2.0, lo2=-2.0, hi2=2.0, away2=0.0):
    def a(shape, layout="c"):
        return R(shape, lo, hi, layout)

    def b(shape, layout="c"):
        return R(shape, lo2, hi2, layout, away2)
    return [P(op, "bcast", (a((3, 1)), b((4,)))), P(op, "same", (a((2, 3)), b((2, 3)))),
            P(op, "0d", (a(()), b(()))), P(op, "0d-bcast", (a((2, 2)), b(()))),
            P(op, "scalar", (a((2, 3)), S(0.75))), P(op, "size0", (a((0, 3)), b((1, 3)))),
            P(op, "T-step", (a((3, 4), "T"), b((4,), "step"))),
            P(op, "bcast3", (a((2, 1, 3), "flip"), b((4, 1))))]


def _win(kernel, dilation=(1, 1), stride=(1, 1)) -> dict:
    return {"kernel": kernel, "dilation": dilation, "stride": stride}


_TIES_A = V([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]])
_TIES_B = V([[1.0], [0.5]])

CASES = (
    _unary("neg") + _unary("exp") + _unary("log", 0.2, 3.0) + _unary("sqrt", 0.2, 3.0)
    + _unary("sin") + _unary("cos") + _unary("tanh") + _unary("sigmoid", -6, 6)
    + _unary("erf") + _unary("abs", away=0.1) + _unary("sign", away=0.1)
    + [P("neg", "int", (I64,), grad=False), P("abs", "int", (I64,), grad=False),
       P("sign", "int", (I64,), grad=False), P("sign", "bool", (BOOLS,), grad=False),
       P("sigmoid", "large", (V([-1e4, -80.0, 0.0, 80.0, 1e4]),))]
    + _binary("add") + _binary("sub") + _binary("mul") + _binary("div", away2=0.3)
    + _binary("pow", 0.3, 2.0) + _binary("maximum") + _binary("minimum")
    + [P(op, "int", (I64, I64B), grad=False) for op in
       ("add", "sub", "mul", "maximum", "minimum")]
    + [P("pow", "int", (np.abs(I64), np.abs(I64B)), grad=False),
       P("add", "bool", (BOOLS, BOOLS[:1]), grad=False),
       P("mul", "bool", (BOOLS, BOOLS[:1]), grad=False),
       P("pow", "neg-base-int-exp", (R((2, 3), -2, -0.5), V(3.0)), wrt=(0,)),
       P("pow", "zero-base", (V([0.0, 0.0, 1.5]), V([0.0, 2.0, 0.0])), wrt=(0,),
         second=False),
       P("div", "int-exact", (V([6.0, -9.0]), V([3.0, 3.0])))]
    + [P(op, name, ins, grad=False)
       for op in ("lt", "le", "gt", "ge", "eq", "ne")
       for name, ins in [("ties-bcast", (_TIES_A, _TIES_B)), ("0d", (R(()), R(()))),
                         ("int", (I64, I64B)), ("size0", (R((0, 2)), R((2,))))]]
    + [P("where", "bcast", (BOOLS[:, :1], R((1, 3)), R(()))),
       P("where", "same", (BOOLS, R((2, 3), layout="T"), R((2, 3)))),
       P("where", "0d", (np.array(True), R(()), R(()))),
       P("where", "size0", (np.zeros((0, 1), bool), R((3,)), R((0, 3)))),
       P("where", "int", (BOOLS, I64, I64B), grad=False),
       P("cast", "f32-f64", (R((2, 3)),), {"dtype": "float64"}, out_dtype=np.float64),
       P("cast", "f32-id", (R((2, 3), layout="T"),), {"dtype": "float32"}, grad=False),
       P("cast", "trunc", (V([-2.7, -0.5, 0.5, 2.7]),), {"dtype": "int64"}, grad=False),
       P("cast", "int-f32", (I64,), {"dtype": "float32"}, grad=False),
       P("cast", "bool-f32", (BOOLS,), {"dtype": "float32"}, grad=False),
       P("cast", "f32-bool", (V([0.0, -0.0, 1.5]),), {"dtype": "bool"}, grad=False)]
    + [P(op, f"{shape}{dims}-k{int(k)}{lay}", (R(shape, layout=lay or "c"),),
         {"dims": dims, "keepdim": k})
       for op in ("sum", "max", "min")
       for shape, dims, k, lay in [((2, 3), (0,), False, ""), ((2, 3), (1,), True, ""),
                                   ((2, 3, 2), (0, 2), False, "T"), ((2, 3), (0, 1), True, ""),
                                   ((2, 3), (), False, ""), ((), (), False, ""),
                                   ((3, 1), (1,), False, "step"), ((1, 0, 2), (2,), True, "")]]
    + [P("sum", "size0", (R((0, 3)),), {"dims": (0,), "keepdim": False}),
       P("sum", "int", (I64,), {"dims": (1,), "keepdim": False}, grad=False),
       P("max", "int", (I64,), {"dims": (0,), "keepdim": True}, grad=False)]
    + [P(op, f"{shape}{dim}-k{int(k)}", (R(shape),), {"dim": dim, "keepdim": k}, grad=False)
       for op in ("argmax", "argmin")
       for shape, dim, k in [((3, 4), None, False), ((3, 4), None, True), ((3, 4), 0, False),
                             ((3, 4), 1, True), ((), None, False), ((2, 3, 2), 2, False)]]
    + [P("argmax", "ties", (V([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]]),), {"dim": 1,
                                                                      "keepdim": False},
         grad=False),
       P("argmin", "ties", (V([[1.0, 1.0, 3.0], [2.0, 0.0, 0.0]]),), {"dim": None,
                                                                      "keepdim": False},
         grad=False)]
    + [P("reshape", "2x6", (R((3, 4)),), {"shape": (2, 6)}),
       P("reshape", "T", (R((3, 4), layout="T"),), {"shape": (12,)}),
       P("reshape", "0d-up", (R(()),), {"shape": (1, 1)}),
       P("reshape", "to-0d", (R((1, 1)),), {"shape": ()}),
       P("reshape", "size0", (R((0, 3)),), {"shape": (3, 0, 1)}),
       P("permute", "3d", (R((2, 3, 4)),), {"dims": (2, 0, 1)}),
       P("permute", "step", (R((2, 3), layout="step"),), {"dims": (1, 0)}),
       P("permute", "0d", (R(()),), {"dims": ()}),
       P("detach", "T", (R((3, 2), layout="T"),), grad=False),
       P("detach", "0d", (R(()),), grad=False),
       P("expand", "bcast", (R((3, 1)),), {"shape": (2, 3, 4)}),
       P("expand", "0d", (R(()),), {"shape": (2, 2)}),
       P("expand", "size0", (R((1, 3)),), {"shape": (0, 3)}),
       P("expand", "step", (R((3, 1), layout="step"),), {"shape": (2, 3, 4)}),
       P("slice", "step", (R((4, 5)),), {"index": ((0, 4, 2), (1, 5, 3))}),
       P("slice", "empty", (R((4, 5)),), {"index": ((2, 2, 1), (0, 5, 1))}),
       P("slice", "T", (R((4, 3), layout="T"),), {"index": ((1, 3, 1), (0, 3, 2))}),
       P("pad_slice", "step", (R((2, 2)),), {"shape": (4, 5), "index": ((0, 4, 2), (1, 5, 3))}),
       P("pad_slice", "0d-in-1d", (R((1,)),), {"shape": (3,), "index": ((2, 3, 1),)}),
       P("cat", "dim0", (R((2, 3)), R((1, 3)), R((0, 3))), {"dim": 0}),
       P("cat", "dim1-T", (R((2, 3), layout="T"), R((2, 1))), {"dim": 1}),
       P("cat", "single", (R((2,)),), {"dim": 0}),
       P("cat", "int", (I64, I64[:1]), {"dim": 0}, grad=False),
       P("take", "dim0", (R((3, 4)), np.array([[0, 2], [1, -1]])), {"dim": 0}),
       P("take", "dim1-repeat", (R((3, 4), layout="T"), np.array([3, 3, 0])), {"dim": 1}),
       P("take", "0d-index", (R((3, 4)), np.array(2)), {"dim": 1}),
       P("take", "empty-index", (R((3, 4)), np.zeros((0,), np.int64)), {"dim": 0}),
       P("scatter_add", "repeat", (R((2, 3)), np.array([1, 1, 0])), {"dim": 1, "size": 4}),
       P("scatter_add", "2d-index", (R((2, 2, 3)), np.array([[0, 2], [2, 1]])),
         {"dim": 0, "size": 3}),
       P("cumsum", "dim1", (R((3, 4)),), {"dim": 1}),
       P("cumsum", "dim0-T", (R((4, 3), layout="T"),), {"dim": 0}),
       P("cumsum", "0d", (R(()),), {"dim": 0}),
       P("cumsum", "int", (I64,), {"dim": 1}, grad=False),
       P("argsort", "ties", (V([[3.0, 1.0, 3.0, -2.0], [0.5, 0.5, 0.5, 0.0]]),),
         {"dim": 1, "descending": False}, grad=False),
       P("argsort", "desc-ties", (V([[3.0, 1.0, 3.0, -2.0], [0.5, 0.5, 0.5, 0.0]]),),
         {"dim": 1, "descending": True}, grad=False),
       P("argsort", "dim0-int", (I64,), {"dim": 0, "descending": True}, grad=False),
       P("unfold", "3x3", (R((2, 3, 5, 4)),), _win((3, 3))),
       P("unfold", "stride-dilation", (R((1, 2, 9, 7), layout="T"),), _win((2, 3), (2, 1), (3, 2))),
       P("unfold", "1x1", (R((2, 1, 3, 3), layout="step"),), _win((1, 1))),
       P("fold", "3x3", (R((2, 3, 2, 3, 3, 3)),), {"size": (5, 4), **_win((3, 3))}),
       P("fold", "stride-dilation", (R((1, 3, 3, 2, 2, 3)),),
         {"size": (9, 7), **_win((2, 3), (2, 1), (3, 2))}),
       P("fold", "gaps", (R((1, 2, 2, 1, 2, 2)),),
         {"size": (7, 7), **_win((2, 2), (1, 1), (4, 4))}),
       P("matmul", "2d", (R((2, 3)), R((3, 4)))),
       P("matmul", "batched-bcast", (R((2, 1, 2, 3)), R((3, 3, 2)))),
       P("matmul", "T-step", (R((2, 3), layout="T"), R((3, 2), layout="step"))),
       P("matmul", "inner0", (R((2, 0)), R((0, 3)))),
       P("matmul", "int", (I64, I64.T.copy()), grad=False)]
)
GRAD_CASES = [c for c in CASES if c.grad]
IDS = [c.id for c in CASES]
assert len(set(IDS)) == len(IDS), "case ids must be unique"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_vs_float64_reference(case):
    check_forward(case.fn, case.ref, case.inputs, seed_of(case.id),
                  float_dtype=case.out_dtype)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_shape_rule_agrees_with_impl(case):
    opdef = REGISTRY[case.op]
    arrays = make_inputs(case.inputs, np.float32, seed_of(case.id))
    shapes = [np.shape(a) for a in arrays]
    dtypes = [np.asarray(a).dtype for a in arrays]
    shape, dtype = opdef.check(shapes, dtypes, case.attrs)
    out = np.asarray(opdef.impl(*arrays, **case.attrs))
    assert (tuple(shape), np.dtype(dtype)) == (out.shape, out.dtype)
    eager = apply(case.op, wrap(arrays), case.attrs)
    assert (eager.shape, eager._data.dtype) == (out.shape, out.dtype)
    if opdef.has(Trait.ELEMENTWISE):
        assert tuple(shape) == np.broadcast_shapes(*shapes)
    if opdef.has(Trait.COMPARISON):
        assert out.dtype == np.bool_
    if opdef.has(Trait.COMMUTATIVE):
        swapped = np.asarray(opdef.impl(*arrays[::-1], **case.attrs))
        np.testing.assert_array_equal(out, swapped)


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.id for c in GRAD_CASES])
def test_grad_vs_finite_differences(case):
    check_grad(case.fn, case.inputs, seed_of(case.id), wrt=case.wrt)


SECOND_CASES = [c for c in GRAD_CASES if c.second]


@pytest.mark.parametrize("case", SECOND_CASES, ids=[c.id for c in SECOND_CASES])
def test_second_order_vs_finite_differences(case):
    """vjp rules are written with ops, so they differentiate again (create_graph=True)."""
    check_second_order(case.fn, case.inputs, seed_of(case.id), wrt=case.wrt)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_eager_equals_interpreted(case):
    check_interpreted(case.fn, case.inputs, seed_of(case.id))


# ---- properties --------------------------------------------------------------------------

_BINARY_EW = sorted(n for n, d in REGISTRY.items()
                    if d.arity == 2 and d.has(Trait.ELEMENTWISE))


@settings(max_examples=60, deadline=None, database=None)
@given(op=st.sampled_from(_BINARY_EW),
       shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3,
                                                min_side=0, max_side=3),
       seed=st.integers(0, 2**16))
def test_binary_broadcasting_matches_numpy(op, shapes, seed):
    """Every binary elementwise primitive broadcasts as NumPy does, forward and backward."""
    lo = 0.3 if op == "pow" else -2.0
    arrays = make_inputs((R(shapes.input_shapes[0], lo), R(shapes.input_shapes[1], 0.3)),
                         np.float32, seed)
    out = apply(op, wrap(arrays))
    assert out.shape == shapes.result_shape
    ref = REFS[op](*to64(arrays))
    assert_matches_ref(out, ref, float_dtype=ref.dtype if ref.dtype.kind != "f"
                       else np.float32)
    if REGISTRY[op].differentiable:
        a, b = (hn.tensor(x, dtype=hn.float64, requires_grad=True) for x in arrays)
        ga, gb = hn.grad(apply(op, (a, b)).sum(), (a, b))
        assert ga.shape == a.shape and gb.shape == b.shape
