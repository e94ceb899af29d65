"""Every composite of the public API (API.md) gets the same triple check as the primitives:
float64 NumPy reference, central finite differences, eager == interpreted recorded graph;
and, when torch is importable, forward and gradients against torch in one dedicated test.

A case's `fn(m, *tensors)` is written once for both libraries: `m` is `hybridnet` or `torch`.
"""

import importlib.util
import math
from dataclasses import dataclass

import numpy as np
import pytest
import scipy.special as sp
from oracles import (
    R,
    check_forward,
    check_grad,
    check_interpreted,
    check_second_order,
    flat,
    make_inputs,
    seed_of,
    wrap,
)

import hybridnet as hn


@dataclass(frozen=True)
class C:
    name: str
    fn: object  # fn(m, *tensors) with m = hybridnet or torch
    ref: object  # float64 NumPy reference on arrays
    inputs: tuple
    grad: bool = True  # False when no float input reaches a float output
    rerun: bool = True  # False when the recorded graph bakes in data-dependent indices
    torch: bool = True  # False where torch deliberately differs or warns


X, Y = R((3, 4)), R((3, 4))
X3 = R((2, 3, 4))
XT = R((3, 4), layout="T")
POS = R((3, 4), 0.3, 2.0)
AWAY = R((3, 4), away=0.1)
Z = R(())
ROW = R((4,))
E = R((0, 4))
COND = np.array([[True, False, True, False], [False, False, True, True], [True] * 4])
MASK = COND
ROWMASK = np.array([True, False, True])
IDX = np.array([2, 0, -1, 0])
NAN = float("nan")
erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(approx):
    def fn(m, x):
        f = m.gelu if m is hn else m.nn.functional.gelu
        return f(x, approximate=approx)
    return fn


def gelu_ref(x, approx):
    if approx == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def silu(m, x):
    return m.silu(x) if m is hn else m.nn.functional.silu(x)


def chunks(x, size, axis):
    n = x.shape[axis]
    return [np.take(x, range(i, min(i + size, n)), axis=axis) for i in range(0, n, size)]


def pieces(x, sizes, axis):
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def ops_mix(m, x, y):
    return (2 * x - y / 3 + 1) * -x / (abs(y) + 1) - 1 / (2 + y * y)


def iops(m, x, y):
    t = x.clone()
    t += y
    t *= 2.0
    t -= y
    t /= 4.0
    return t


CASES = [
    # ---- elementwise
    C("rsqrt", lambda m, x: x.rsqrt(), lambda x: 1 / np.sqrt(x), (POS,)),
    C("rsqrt-fn-0d", lambda m, x: m.rsqrt(x), lambda x: 1 / np.sqrt(x), (R((), 0.3, 2),)),
    C("sigmoid", lambda m, x: m.sigmoid(x), lambda x: 1 / (1 + np.exp(-x)), (X,)),
    C("sigmoid-method-T", lambda m, x: x.sigmoid(), lambda x: sp.expit(x), (XT,)),
    C("relu", lambda m, x: m.relu(x), lambda x: np.maximum(x, 0), (AWAY,)),
    C("relu-method-0d", lambda m, x: x.relu(), lambda x: np.maximum(x, 0), (R((), away=.1),)),
    C("relu-size0", lambda m, x: m.relu(x), lambda x: np.maximum(x, 0), (E,)),
    C("gelu-none", gelu("none"), lambda x: gelu_ref(x, "none"), (X,)),
    C("gelu-tanh", gelu("tanh"), lambda x: gelu_ref(x, "tanh"), (X,)),
    C("gelu-0d", gelu("none"), lambda x: gelu_ref(x, "none"), (Z,)),
    C("silu", silu, lambda x: x / (1 + np.exp(-x)), (XT,)),
    C("square", lambda m, x: x.square(), np.square, (X,)),
    C("square-fn", lambda m, x: m.square(x), np.square, (Z,)),
    C("reciprocal", lambda m, x: x.reciprocal(), lambda x: 1 / x, (AWAY,)),
    C("clamp-both", lambda m, x: x.clamp(-0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7), (X,)),
    C("clamp-min", lambda m, x: m.clamp(x, min=0.1), lambda x: np.maximum(x, 0.1), (X,)),
    C("clamp-max", lambda m, x: x.clamp(max=-0.2), lambda x: np.minimum(x, -0.2), (XT,)),
    C("clamp-tensors", lambda m, x, lo, hi: m.clamp(x, min=lo, max=hi),
      lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi), (X, R((4,), -1, -.2), R((3, 1), .2, 1))),
    C("pow-2", lambda m, x: x ** 2, lambda x: x ** 2, (X,)),
    C("pow-3-int", lambda m, x: x ** 3, lambda x: x ** 3, (X,)),
    C("pow-half", lambda m, x: x ** 0.5, np.sqrt, (POS,)),
    C("pow-fn-neg", lambda m, x: m.pow(x, -1.5), lambda x: x ** -1.5, (POS,)),
    C("pow-zero", lambda m, x: x ** 0, lambda x: x ** 0, (AWAY,)),
    C("rpow", lambda m, x: 2.0 ** x, lambda x: 2.0 ** x, (X,)),
    C("pow-tensor", lambda m, a, b: m.pow(a, b), np.power, (R((3, 1), 0.3, 2), ROW)),
    C("pow-tensor-op", lambda m, a, b: a ** b, np.power, (R((), 0.3, 2), XT)),
    C("maximum", lambda m, a, b: m.maximum(a, b), np.maximum, (X, ROW)),
    C("minimum", lambda m, a, b: m.minimum(a, b), np.minimum, (R((3, 1)), X)),
    C("max-other", lambda m, a, b: a.max(b), np.maximum, (X, Y)),
    C("min-other", lambda m, a, b: m.min(a, b), np.minimum, (XT, ROW)),
    C("where", lambda m, a, b: m.where(m.tensor(COND), a, b),
      lambda a, b: np.where(COND, a, b), (X, ROW)),
    C("where-scalar", lambda m, a: m.where(m.tensor(COND), a, 0.0),
      lambda a: np.where(COND, a, 0.0), (XT,)),
    C("where-two-scalars", lambda m: m.where(m.tensor(COND), 1.0, -1.0),
      lambda: np.where(COND, 1.0, -1.0), (), grad=False),
    C("where-0d", lambda m, a, b: m.where(a > b, a, b), np.maximum, (Z, R(()))),
    C("operators", ops_mix, lambda x, y: (2 * x - y / 3 + 1) * -x / (abs(y) + 1) - 1 / (2 + y * y),
      (X, R((4,), layout="flip"))),
    C("reflected", lambda m, x: 1 - 3 / x, lambda x: 1 - 3 / x, (AWAY,)),
    # ---- reductions
    C("sum-all", lambda m, x: x.sum(), np.sum, (X,)),
    C("sum-neg-dim", lambda m, x: x.sum(-1), lambda x: x.sum(-1), (XT,)),
    C("sum-tuple-keep", lambda m, x: m.sum(x, (0, -1), keepdim=True),
      lambda x: x.sum((0, 2), keepdims=True), (X3,)),
    C("sum-0d", lambda m, x: x.sum(), np.sum, (Z,)),
    C("sum-size0-dim", lambda m, x: x.sum(0), lambda x: x.sum(0), (E,)),
    C("mean-all", lambda m, x: x.mean(), np.mean, (X,)),
    C("mean-dim", lambda m, x: m.mean(x, 1), lambda x: x.mean(1), (XT,)),
    C("mean-tuple-keep", lambda m, x: x.mean((0, 2), keepdim=True),
      lambda x: x.mean((0, 2), keepdims=True), (X3,)),
    C("mean-0d", lambda m, x: x.mean(), np.mean, (Z,)),
    C("var-all", lambda m, x: x.var(), lambda x: np.var(x, ddof=1), (X,)),
    C("var-correction0", lambda m, x: x.var(1, correction=0), lambda x: np.var(x, 1), (X,)),
    C("var-unbiased-false", lambda m, x: m.var(x, (0, 2), unbiased=False, keepdim=True),
      lambda x: np.var(x, (0, 2), keepdims=True), (X3,)),
    C("var-unbiased-true", lambda m, x: x.var(0, unbiased=True),
      lambda x: np.var(x, 0, ddof=1), (XT,)),
    C("var-correction2", lambda m, x: x.var(-1, correction=2),
      lambda x: np.var(x, -1, ddof=2), (X,)),
    C("std-all", lambda m, x: m.std(x), lambda x: np.std(x, ddof=1), (X,)),
    C("std-dim-keep", lambda m, x: x.std(1, keepdim=True),
      lambda x: np.std(x, 1, ddof=1, keepdims=True), (XT,)),
    C("std-tuple-correction0", lambda m, x: x.std((1, 2), correction=0),
      lambda x: np.std(x, (1, 2)), (X3,)),
    C("amax-all", lambda m, x: x.amax(), np.max, (X,)),
    C("amax-neg-dim", lambda m, x: m.amax(x, -1), lambda x: x.max(-1), (X,)),
    C("amax-tuple-keep", lambda m, x: x.amax((0, 2), keepdim=True),
      lambda x: x.max((0, 2), keepdims=True), (X3,)),
    C("amin-dim", lambda m, x: x.amin(0), lambda x: x.min(0), (XT,)),
    C("amin-all-fn", lambda m, x: m.amin(x), np.min, (X3,)),
    C("max-all", lambda m, x: x.max(), np.max, (X,)),
    C("max-dim", lambda m, x: x.max(1), lambda x: (x.max(1), x.argmax(1)), (X,)),
    C("max-dim-keep-neg", lambda m, x: m.max(x, -1, keepdim=True),
      lambda x: (x.max(-1, keepdims=True), x.argmax(-1, keepdims=True)), (X3,)),
    C("max-dim-named", lambda m, x: x.max(dim=0).values, lambda x: x.max(0), (XT,)),
    C("max-0d-dim", lambda m, x: x.max(0), lambda x: (x, np.int64(0)), (Z,)),
    C("min-all", lambda m, x: m.min(x), np.min, (XT,)),
    C("min-dim", lambda m, x: x.min(0), lambda x: (x.min(0), x.argmin(0)), (X,)),
    C("min-dim-indices", lambda m, x: x.min(-1, keepdim=True).indices,
      lambda x: x.argmin(-1, keepdims=True), (X3,), grad=False),
    C("argmax-all", lambda m, x: x.argmax(), np.argmax, (X,), grad=False),
    C("argmax-dim", lambda m, x: x.argmax(1), lambda x: x.argmax(1), (XT,), grad=False),
    C("argmax-keep-neg", lambda m, x: m.argmax(x, -1, keepdim=True),
      lambda x: x.argmax(-1, keepdims=True), (X3,), grad=False),
    C("argmin-all", lambda m, x: m.argmin(x), np.argmin, (X,), grad=False),
    C("argmin-dim", lambda m, x: x.argmin(dim=1), lambda x: x.argmin(1), (X3,), grad=False),
    C("logsumexp-dim", lambda m, x: x.logsumexp(1), lambda x: sp.logsumexp(x, 1), (X,)),
    C("logsumexp-tuple-keep", lambda m, x: m.logsumexp(x, (0, 2), keepdim=True),
      lambda x: sp.logsumexp(x, (0, 2), keepdims=True), (X3,)),
    C("logsumexp-neg-T", lambda m, x: x.logsumexp(-1), lambda x: sp.logsumexp(x, -1), (XT,)),
    C("logsumexp-0d", lambda m, x: x.logsumexp(0), lambda x: x, (Z,)),
    C("softmax-last", lambda m, x: x.softmax(-1), lambda x: sp.softmax(x, -1), (X,)),
    C("softmax-fn-0", lambda m, x: m.softmax(x, 0), lambda x: sp.softmax(x, 0), (X3,)),
    C("softmax-0d", lambda m, x: x.softmax(0), lambda x: np.ones_like(x), (Z,)),
    C("log-softmax", lambda m, x: x.log_softmax(1), lambda x: sp.log_softmax(x, 1), (XT,)),
    C("log-softmax-fn", lambda m, x: m.log_softmax(x, dim=-2),
      lambda x: sp.log_softmax(x, -2), (X3,)),
    # ---- matmul
    C("matmul-1d-1d", lambda m, a, b: a @ b, np.matmul, (ROW, R((4,)))),
    C("matmul-2d-1d", lambda m, a, b: m.matmul(a, b), np.matmul, (X, ROW)),
    C("matmul-1d-2d", lambda m, a, b: a @ b, np.matmul, (ROW, R((4, 2)))),
    C("matmul-2d-2d", lambda m, a, b: a.matmul(b), np.matmul, (X, R((4, 2), layout="T"))),
    C("matmul-batched-bcast", lambda m, a, b: a @ b, np.matmul, (R((2, 1, 3, 4)), R((5, 4, 2)))),
    C("matmul-3d-1d", lambda m, a, b: a @ b, np.matmul, (X3, ROW)),
    C("matmul-1d-3d", lambda m, a, b: m.matmul(a, b), np.matmul, (R((3,)), X3)),
    C("matmul-step", lambda m, a, b: a @ b, np.matmul, (XT, R((4, 2), layout="step"))),
    # ---- shape
    C("reshape-neg1", lambda m, x: x.reshape(2, -1), lambda x: x.reshape(2, -1), (X,)),
    C("reshape-tuple-T", lambda m, x: m.reshape(x, (-1,)), lambda x: x.reshape(-1), (XT,)),
    C("view-neg1", lambda m, x: x.view(-1, 3), lambda x: x.reshape(-1, 3), (X,)),
    C("reshape-0d", lambda m, x: x.reshape(1, 1), lambda x: x.reshape(1, 1), (Z,)),
    C("reshape-size0", lambda m, x: x.reshape(-1, 2), lambda x: x.reshape(-1, 2), (E,)),
    C("flatten-all", lambda m, x: x.flatten(), np.ravel, (X3,)),
    C("flatten-1", lambda m, x: x.flatten(1), lambda x: x.reshape(2, -1), (X3,)),
    C("flatten-neg", lambda m, x: m.flatten(x, -3, -2), lambda x: x.reshape(6, 4), (X3,)),
    C("flatten-0d", lambda m, x: x.flatten(), lambda x: x.reshape(1), (Z,)),
    C("transpose-neg", lambda m, x: x.transpose(0, -1), lambda x: x.swapaxes(0, 2), (X3,)),
    C("transpose-fn", lambda m, x: m.transpose(x, 1, 0), lambda x: x.T, (XT,)),
    C("T-2d", lambda m, x: x.T, lambda x: x.T, (X,)),
    C("T-3d", lambda m, x: x.T, lambda x: x.T, (X3,), torch=False),
    C("permute", lambda m, x: x.permute(2, 0, 1), lambda x: x.transpose(2, 0, 1), (X3,)),
    C("permute-fn-neg", lambda m, x: m.permute(x, (-1, 0, 1)),
      lambda x: x.transpose(2, 0, 1), (X3,)),
    C("unsqueeze-0", lambda m, x: x.unsqueeze(0), lambda x: x[None], (X,)),
    C("unsqueeze-neg", lambda m, x: m.unsqueeze(x, -1), lambda x: x[..., None], (XT,)),
    C("unsqueeze-0d", lambda m, x: x.unsqueeze(0), lambda x: x[None], (Z,)),
    C("squeeze-all", lambda m, x: x.squeeze(), np.squeeze, (R((3, 1, 4, 1)),)),
    C("squeeze-dim", lambda m, x: m.squeeze(x, 1), lambda x: x[:, 0], (R((3, 1, 4, 1)),)),
    C("squeeze-noop", lambda m, x: x.squeeze(-1), lambda x: x, (X,)),
    C("squeeze-tuple", lambda m, x: x.squeeze((1, 3)), np.squeeze, (R((3, 1, 4, 1)),)),
    C("expand", lambda m, x: x.expand(2, 3, 4), lambda x: np.broadcast_to(x, (2, 3, 4)),
      (R((3, 1)),)),
    C("expand-neg1", lambda m, x: m.expand(x, -1, 5) if m is hn else x.expand(-1, 5),
      lambda x: np.broadcast_to(x, (3, 5)), (R((3, 1), layout="step"),)),
    C("expand-0d", lambda m, x: x.expand(2, 2), lambda x: np.broadcast_to(x, (2, 2)), (Z,)),
    C("broadcast_to", lambda m, x: m.broadcast_to(x, (2, 3, 4)),
      lambda x: np.broadcast_to(x, (2, 3, 4)), (ROW,)),
    C("cat-0", lambda m, a, b, e: m.cat([a, b, e], 0), lambda *xs: np.concatenate(xs),
      (X, R((1, 4)), E)),
    C("cat-neg", lambda m, a, b: m.cat([a, b], dim=-1),
      lambda a, b: np.concatenate([a, b], -1), (XT, R((3, 2)))),
    C("cat-single", lambda m, a: m.cat([a]), lambda a: a, (X,)),
    C("stack-0", lambda m, a, b: m.stack([a, b]), lambda a, b: np.stack([a, b]), (X, Y)),
    C("stack-neg", lambda m, a, b: m.stack((a, b), -1), lambda a, b: np.stack([a, b], -1),
      (XT, X)),
    C("stack-0d", lambda m, a, b: m.stack([a, b], dim=0), lambda a, b: np.stack([a, b]),
      (Z, R(()))),
    C("chunk-uneven", lambda m, x: x.chunk(3, dim=1), lambda x: chunks(x, 2, 1), (X,)),
    C("chunk-fn-neg", lambda m, x: m.chunk(x, 2, -1), lambda x: chunks(x, 2, -1), (X3,)),
    C("chunk-rows", lambda m, x: x.chunk(2), lambda x: chunks(x, 3, 0), (R((5, 2)),)),
    C("split-int", lambda m, x: x.split(2), lambda x: chunks(x, 2, 0), (R((5, 2)),)),
    C("split-list-neg", lambda m, x: x.split([1, 3], dim=-1),
      lambda x: pieces(x, [1, 3], -1), (XT,)),
    C("split-fn", lambda m, x: m.split(x, 1, 0), lambda x: chunks(x, 1, 0), (X3,)),
    # ---- indexing
    C("idx-int", lambda m, x: x[1], lambda x: x[1], (X,)),
    C("idx-neg-ints-0d", lambda m, x: x[-1, 2], lambda x: x[-1, 2], (XT,)),
    C("idx-slice-step", lambda m, x: x[::2, 1::2], lambda x: x[::2, 1::2], (X,)),
    C("idx-neg-slice", lambda m, x: x[-2:, :-1], lambda x: x[-2:, :-1], (X3,)),
    C("idx-none", lambda m, x: x[None, :, None], lambda x: x[None, :, None], (X,)),
    C("idx-ellipsis", lambda m, x: x[..., 1], lambda x: x[..., 1], (X3,)),
    C("idx-ellipsis-none", lambda m, x: x[1, ..., None], lambda x: x[1, ..., None], (X3,)),
    C("idx-0d-none", lambda m, x: x[None], lambda x: x[None], (Z,)),
    C("idx-mask", lambda m, x: x[m.tensor(MASK)], lambda x: x[MASK], (X,)),
    C("idx-row-mask", lambda m, x: x[m.tensor(ROWMASK)], lambda x: x[ROWMASK], (XT,)),
    C("idx-mask-data", lambda m, x: x[x > 0], lambda x: x[x > 0], (X,), rerun=False),
    C("idx-tensor-repeat", lambda m, x: x[m.tensor(IDX)], lambda x: x[IDX % 3], (X,)),
    C("idx-tensor-2d", lambda m, x: x[m.tensor(np.array([[0, 1], [2, 0]]))],
      lambda x: x[[[0, 1], [2, 0]]], (XT,)),
    C("idx-tensor-dim1", lambda m, x: x[:, m.tensor(IDX)], lambda x: x[:, IDX], (X,)),
    C("idx-tensor-0d", lambda m, x: x[m.tensor(np.array(1))], lambda x: x[1], (X,)),
    C("idx-tensor-empty", lambda m, x: x[m.tensor(np.zeros(0, np.int64))],
      lambda x: x[np.zeros(0, np.int64)], (X,)),
    C("idx-list", lambda m, x: x[[0, 2]], lambda x: x[[0, 2]], (X,)),
    C("idx-two-tensors", lambda m, x: x[m.tensor(np.array([0, 2, 2])), m.tensor(IDX[:3])],
      lambda x: x[[0, 2, 2], IDX[:3]], (X,)),
    C("idx-two-bcast", lambda m, x: x[m.tensor(np.array([[0], [2]])), m.tensor(IDX)],
      lambda x: x[[[0], [2]], IDX], (XT,)),
    # PyTorch applies integers first: x[0, :, idx] has shape (3, len(idx)) (NumPy: (len, 3))
    C("idx-int-slice-tensor", lambda m, x: x[0, :, m.tensor(np.array([3, 0, 3]))],
      lambda x: x[0][:, [3, 0, 3]], (X3,)),
    C("idx-split-tensors", lambda m, x: x[m.tensor(np.array([1, 0])), :, m.tensor(IDX[:2])],
      lambda x: x[[1, 0], :, IDX[:2]], (X3,)),
    C("idx-slice-list-T", lambda m, x: x[1:, [0, 2]], lambda x: x[1:, [0, 2]], (XT,)),
    # ---- in place (forward runs under no_grad; gradients go through clone())
    C("add_", lambda m, x, y: x.clone().add_(y), np.add, (X, Y)),
    C("add_-alpha", lambda m, x, y: x.clone().add_(y, alpha=2.0), lambda x, y: x + 2 * y, (X, ROW)),
    C("sub_-bcast", lambda m, x, y: x.clone().sub_(y), np.subtract, (XT, ROW)),
    C("mul_-scalar", lambda m, x: x.clone().mul_(3.0), lambda x: 3 * x, (X,)),
    C("mul_-tensor", lambda m, x, y: x.clone().mul_(y), np.multiply, (X, R((3, 1)))),
    C("div_", lambda m, x, y: x.clone().div_(y), np.divide, (X, AWAY)),
    C("inplace-operators", iops, lambda x, y: (2 * (x + y) - y) / 4, (X, ROW)),
    C("zero_", lambda m, x: x.clone().zero_(), np.zeros_like, (X,)),
    C("fill_", lambda m, x: x.clone().fill_(2.5), lambda x: np.full_like(x, 2.5), (XT,)),
    C("copy_", lambda m, x, y: x.clone().copy_(y), lambda x, y: np.broadcast_to(y, x.shape),
      (X, ROW)),
    C("clamp_", lambda m, x: x.clone().clamp_(-0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5), (X,)),
    C("clamp_-min", lambda m, x: x.clone().clamp_(min=0.0), lambda x: np.maximum(x, 0), (AWAY,)),
]
IDS = [c.name for c in CASES]
assert len(set(IDS)) == len(IDS)
GRAD_CASES = [c for c in CASES if c.grad]
TORCH_CASES = [c for c in CASES if c.torch]


def _hn(case):
    return lambda *ts: case.fn(hn, *ts)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_vs_float64_reference(case):
    check_forward(_hn(case), case.ref, case.inputs, seed_of(case.name))


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.name for c in GRAD_CASES])
def test_grad_vs_finite_differences(case):
    check_grad(_hn(case), case.inputs, seed_of(case.name))


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.name for c in GRAD_CASES])
def test_second_order_vs_finite_differences(case):
    check_second_order(_hn(case), case.inputs, seed_of(case.name))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_eager_equals_interpreted(case):
    check_interpreted(_hn(case), case.inputs, seed_of(case.name), rerun=case.rerun)


def _dtype_name(dt) -> str:
    return str(dt).split(".")[-1]


@pytest.mark.parametrize("case", TORCH_CASES, ids=[c.name for c in TORCH_CASES])
def test_matches_torch(case):
    import torch

    def to_torch(arrays):
        return [torch.from_numpy(np.array(a)) for a in arrays]

    seed = seed_of(case.name)
    for dtype, tol in ((np.float32, 1e-5), (np.float64, 1e-10)):
        with hn.no_grad():
            ours = flat(case.fn(hn, *wrap(make_inputs(case.inputs, dtype, seed))))
        theirs = flat(case.fn(torch, *to_torch(make_inputs(case.inputs, dtype, seed))))
        assert len(ours) == len(theirs)
        for o, t in zip(ours, theirs):
            assert o.shape == tuple(t.shape)
            assert _dtype_name(o.dtype) == _dtype_name(t.dtype)
            np.testing.assert_allclose(o._data, t.numpy(), rtol=tol, atol=tol)
    if not case.grad:
        return
    arrays = make_inputs(case.inputs, np.float64, seed)
    ht, tt = wrap(make_inputs(case.inputs, np.float64, seed)), to_torch(arrays)
    wrt = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]
    for i in wrt:
        ht[i].requires_grad_()
        tt[i].requires_grad_()
    ho, to = flat(case.fn(hn, *ht)), flat(case.fn(torch, *tt))
    picks = [k for k, o in enumerate(to) if o.requires_grad]
    assert picks == [k for k, o in enumerate(ho) if o.requires_grad]
    ws = [np.random.default_rng(seed).standard_normal(tuple(to[k].shape)) for k in picks]
    hg = hn.grad([ho[k] for k in picks], [ht[i] for i in wrt],
                 grad_outputs=[hn.from_numpy(w) for w in ws], allow_unused=True)
    tg = torch.autograd.grad([to[k] for k in picks], [tt[i] for i in wrt],
                             grad_outputs=[torch.from_numpy(w) for w in ws], allow_unused=True)
    for i, g, t in zip(wrt, hg, tg):
        expected = np.zeros(arrays[i].shape) if t is None else t.numpy()
        actual = np.zeros(arrays[i].shape) if g is None else g._data
        np.testing.assert_allclose(actual, expected, rtol=1e-10, atol=1e-12,
                                   err_msg=f"gradient of input {i}")


if importlib.util.find_spec("torch") is None:  # compared with PyTorch only where it is installed
    del test_matches_torch
