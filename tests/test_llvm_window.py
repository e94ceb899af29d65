"""The llvm backend's own rules for argmax/argmin (first extreme, first NaN wins, as
NumPy) and for the sliding-window primitives unfold/fold, against eager on the dtypes
and layouts the JIT gives them (compiler.lowering.llvm_argreduce, llvm_window)."""

import numpy as np
import pytest
from test_trace_ops import compiled_by

import hybridnet as hn
from hybridnet.dispatch import apply

NAN = float("nan")
ARRAYS = {
    "f32-nan": np.array([[1.0, NAN, 3.0, NAN], [2.0, 5.0, 5.0, -1.0], [NAN, 0.0, 9.0, 9.0]],
                        np.float32),
    "f64-ties": np.array([[3.0, 3.0, -1.0], [-2.0, -2.0, -2.0]]),
    "f64-inf": np.array([[-np.inf, -np.inf], [np.inf, 1.0]]),
    "i64": np.array([[3, -7, 3], [-7, 0, -7]], np.int64),
    "i32": np.array([[2, 9], [9, 2]], np.int32),
    "bool": np.array([[False, True, True], [False, False, False]]),
}


def _traced(fn, *arrays):
    tf = hn.trace(fn, backend="llvm")
    xs = [hn.tensor(a) for a in arrays]
    with hn.no_grad():
        tf(*xs)
        out = tf(*xs)
    return tf, out


@pytest.mark.parametrize("name", sorted(ARRAYS))
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_arg_reductions_in_llvm_match_numpy(op, name):
    a = ARRAYS[name]

    def f(x):
        return (apply(op, (x,), {"dim": 1, "keepdim": False}),
                apply(op, (x,), {"dim": 0, "keepdim": True}),
                apply(op, (x,), {"dim": None, "keepdim": False}))
    tf, outs = _traced(f, a)
    assert compiled_by(tf)[0] == "llvm", compiled_by(tf)
    fn = getattr(np, op)
    for got, want in zip(outs, (fn(a, 1), fn(a, 0, keepdims=True), fn(a))):
        np.testing.assert_array_equal(got.numpy(), want)


WINDOWS = [((3, 3), (1, 1), (1, 1)), ((2, 3), (2, 1), (3, 2)), ((1, 1), (1, 1), (2, 2))]


@pytest.mark.parametrize("kernel,dilation,stride", WINDOWS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_unfold_and_fold_in_llvm_match_eager(kernel, dilation, stride, dtype):
    x = (np.arange(2 * 3 * 9 * 8) % 11 - 5).reshape(2, 3, 9, 8).astype(dtype)
    attrs = {"kernel": kernel, "dilation": dilation, "stride": stride}

    def f(x):
        t = x.permute(0, 1, 3, 2)  # a strided source
        cols = apply("unfold", (t,), attrs)
        return cols, apply("fold", (cols,), {"size": tuple(t.shape[2:]), **attrs})
    tf, (cols, back) = _traced(f, x)
    assert compiled_by(tf)[0] == "llvm", compiled_by(tf)
    want_cols, want_back = f(hn.tensor(x))
    np.testing.assert_array_equal(cols.numpy(), want_cols.numpy())
    np.testing.assert_array_equal(back.numpy(), want_back.numpy())
