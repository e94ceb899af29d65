"""Losses against NumPy references (tests/nn_refs.py), their gradients and their errors."""

import importlib.util

import numpy as np
import pytest
from nn_refs import bce_with_logits, cross_entropy, log_softmax, nll_loss, np_of, sigmoid, softmax

import hybridnet as hn
import hybridnet.nn.functional as F

nn = hn.nn
TOL = dict(rtol=1e-10, atol=1e-12)
REDUCTIONS = ["mean", "sum", "none"]
C = 5
WEIGHT = np.array([0.5, 2.0, 1.0, 0.25, 3.0])


def _case(shape_kind, rng, with_ignored):
    """Logits and int targets for (N, C), (N, C, d), (N, C, d1, d2) or a 1-D (C,) input."""
    if shape_kind == "2d":
        logits, target = rng.standard_normal((7, C)), rng.integers(0, C, 7)
    elif shape_kind == "3d":
        logits, target = rng.standard_normal((3, C, 4)), rng.integers(0, C, (3, 4))
    elif shape_kind == "4d":
        logits, target = rng.standard_normal((2, C, 3, 4)), rng.integers(0, C, (2, 3, 4))
    else:
        logits, target = rng.standard_normal(C), np.array(3)
    if with_ignored and shape_kind != "1d":
        target.reshape(-1)[[1, 4]] = -100
    return logits, target


# (weight, ignore_index present, label_smoothing)
CE_OPTIONS = [(None, False, 0.0), (None, True, 0.0), (WEIGHT, False, 0.0), (WEIGHT, True, 0.0),
              (None, False, 0.1), (None, True, 0.25)]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape_kind", ["2d", "3d", "4d", "1d"])
@pytest.mark.parametrize("options", CE_OPTIONS,
                         ids=lambda o: f"w{o[0] is not None:d}-ign{o[1]:d}-ls{o[2]}")
def test_cross_entropy_vs_numpy(reduction, shape_kind, options):
    weight, ignored, smoothing = options
    rng = np.random.default_rng(0)
    logits, target = _case(shape_kind, rng, ignored)
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    w = None if weight is None else hn.tensor(weight)
    x = hn.tensor(logits, requires_grad=True)
    out = F.cross_entropy(x, hn.tensor(target), weight=w, **kw)
    ref = cross_entropy(logits, target, weight=weight, **kw)
    assert out.shape == np.shape(ref)
    np.testing.assert_allclose(np_of(out), ref, **TOL)
    module = nn.CrossEntropyLoss(weight=w, **kw)
    np.testing.assert_allclose(np_of(module(x, hn.tensor(target))), ref, **TOL)
    # the gradient of sum(out * g) vs central differences of the reference
    g = rng.standard_normal(np.shape(ref))
    (out * hn.tensor(g)).sum().backward()
    grad = np_of(x.grad)
    for index in list(np.ndindex(logits.shape))[::7]:
        old = logits[index]
        logits[index] = old + 1e-6
        hi = (cross_entropy(logits, target, weight=weight, **kw) * g).sum()
        logits[index] = old - 1e-6
        lo = (cross_entropy(logits, target, weight=weight, **kw) * g).sum()
        logits[index] = old
        fd = (hi - lo) / 2e-6
        assert abs(grad[index] - fd) < 1e-7 + 1e-6 * abs(fd), index


def test_cross_entropy_gradient_is_softmax_minus_onehot():
    rng = np.random.default_rng(1)
    logits, target = rng.standard_normal((6, C)), rng.integers(0, C, 6)
    x = hn.tensor(logits, requires_grad=True)
    F.cross_entropy(x, hn.tensor(target)).backward()
    expected = softmax(logits, 1)
    expected[np.arange(6), target] -= 1
    np.testing.assert_allclose(np_of(x.grad), expected / 6, **TOL)


def test_cross_entropy_ignore_index_rows_get_no_gradient_and_custom_index():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((4, C))
    target = np.array([1, 3, 3, 0])
    x = hn.tensor(logits, requires_grad=True)
    loss = F.cross_entropy(x, hn.tensor(target), ignore_index=3)
    ref = cross_entropy(logits, target, ignore_index=3)
    np.testing.assert_allclose(np_of(loss), ref, **TOL)
    np.testing.assert_allclose(float(loss.item()), -(log_softmax(logits, 1)[[0, 3], [1, 0]]).mean())
    loss.backward()
    assert not np_of(x.grad)[[1, 2]].any() and np_of(x.grad)[[0, 3]].any()
    all_ignored = F.cross_entropy(x, hn.tensor([3, 3, 3, 3]), ignore_index=3)
    assert np.isnan(float(all_ignored.item()))  # 0 / 0, as in PyTorch


def test_cross_entropy_float32_is_stable_for_large_logits():
    logits = np.array([[1000.0, 0.0, -1000.0], [0.0, 0.0, 500.0]], dtype=np.float32)
    out = F.cross_entropy(hn.tensor(logits), hn.tensor([0, 0]), reduction="none")
    np.testing.assert_allclose(np_of(out), [0.0, 500.0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_vs_numpy(reduction, weighted):
    rng = np.random.default_rng(3)
    logp = log_softmax(rng.standard_normal((8, C)), 1)
    target = rng.integers(0, C, 8)
    target[5] = -100
    weight = WEIGHT if weighted else None
    out = F.nll_loss(hn.tensor(logp), hn.tensor(target),
                     weight=None if weight is None else hn.tensor(weight), reduction=reduction)
    ref = nll_loss(logp, target, weight, reduction=reduction)
    np.testing.assert_allclose(np_of(out), ref, **TOL)
    mod = nn.NLLLoss(weight=None if weight is None else hn.tensor(weight), reduction=reduction)
    np.testing.assert_allclose(np_of(mod(hn.tensor(logp), hn.tensor(target))), ref, **TOL)


def test_nll_loss_on_spatial_input():
    rng = np.random.default_rng(4)
    logp = log_softmax(rng.standard_normal((2, C, 6)), 1)
    target = rng.integers(0, C, (2, 6))
    out = F.nll_loss(hn.tensor(logp), hn.tensor(target), reduction="none")
    assert out.shape == (2, 6)
    np.testing.assert_allclose(np_of(out), -np.take_along_axis(logp, target[:, None], 1)[:, 0])


REGRESSION = [
    (F.mse_loss, nn.MSELoss, lambda d: d * d, lambda d: 2 * d),
    (F.l1_loss, nn.L1Loss, np.abs, np.sign),
]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("fn, cls, ref, dref", REGRESSION, ids=["mse", "l1"])
def test_regression_losses(reduction, fn, cls, ref, dref):
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    x = hn.tensor(a, requires_grad=True)
    out = fn(x, hn.tensor(b), reduction=reduction)
    per = ref(a - b)
    expected = {"mean": per.mean(), "sum": per.sum(), "none": per}[reduction]
    np.testing.assert_allclose(np_of(out), expected, **TOL)
    np.testing.assert_allclose(np_of(cls(reduction=reduction)(x, hn.tensor(b))), expected, **TOL)
    out.sum().backward()
    scale = 1 / a.size if reduction == "mean" else 1.0
    np.testing.assert_allclose(np_of(x.grad), dref(a - b) * scale, **TOL)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted, pos_weighted", [(False, False), (True, False), (False, True),
                                                     (True, True)])
def test_bce_with_logits_vs_numpy(reduction, weighted, pos_weighted):
    rng = np.random.default_rng(6)
    x, y = 3 * rng.standard_normal((5, 4)), rng.uniform(0, 1, (5, 4))
    y[0] = np.round(y[0])
    weight = rng.uniform(0.5, 2, (5, 4)) if weighted else None
    pos_weight = rng.uniform(0.5, 3, 4) if pos_weighted else None
    xt = hn.tensor(x, requires_grad=True)
    out = F.binary_cross_entropy_with_logits(
        xt, hn.tensor(y), weight=None if weight is None else hn.tensor(weight),
        reduction=reduction, pos_weight=None if pos_weight is None else hn.tensor(pos_weight))
    ref = bce_with_logits(x, y, weight, reduction, pos_weight)
    np.testing.assert_allclose(np_of(out), ref, **TOL)
    out.sum().backward()
    # d/dx of -(pw*y*log s + (1-y)*log(1-s)) = (1-y)*s - pw*y*(1-s)
    pw = 1.0 if pos_weight is None else pos_weight
    s = sigmoid(x)
    grad = (1 - y) * s - pw * y * (1 - s)
    grad = grad * (1.0 if weight is None else weight)
    grad = grad / x.size if reduction == "mean" else grad
    np.testing.assert_allclose(np_of(xt.grad), grad, **TOL)


@pytest.mark.parametrize("dtype", [hn.float32, hn.float64])
def test_bce_with_logits_large_logits_are_finite(dtype):
    x = hn.tensor([100.0, -100.0, 100.0, -100.0, 0.0], dtype=dtype, requires_grad=True)
    y = hn.tensor([0.0, 1.0, 1.0, 0.0, 1.0], dtype=dtype)
    out = F.binary_cross_entropy_with_logits(x, y, reduction="none")
    vals = np_of(out)
    assert np.isfinite(vals).all()
    np.testing.assert_allclose(vals, [100.0, 100.0, 0.0, 0.0, np.log(2)], rtol=1e-6, atol=1e-6)
    pw = F.binary_cross_entropy_with_logits(x, y, reduction="sum", pos_weight=hn.tensor(
        [3.0] * 5, dtype=dtype))
    np.testing.assert_allclose(float(pw.item()), 300.0 + 100.0 + 3 * np.log(2), rtol=1e-6)
    out.sum().backward()
    np.testing.assert_allclose(np_of(x.grad), [1.0, -1.0, 0.0, 0.0, -0.5], atol=1e-6)
    module = nn.BCEWithLogitsLoss()
    assert np.isfinite(float(module(x, y).item()))


def test_loss_errors():
    logits = hn.randn(4, 3)
    with pytest.raises(hn.DTypeError, match="integer"):
        F.cross_entropy(logits, hn.tensor([0.0, 1.0, 2.0, 1.0]))
    with pytest.raises(IndexError, match="7"):
        F.cross_entropy(logits, hn.tensor([0, 7, 1, 2]))
    with pytest.raises(IndexError, match="-3"):
        F.cross_entropy(logits, hn.tensor([0, -3, 1, 2]))
    with pytest.raises(IndexError, match="5"):
        F.nll_loss(logits, hn.tensor([5, 0, 1, 2]))
    with pytest.raises(hn.ShapeError):
        F.cross_entropy(logits, hn.tensor([0, 1]))
    with pytest.raises(hn.ShapeError, match="mse_loss") as info:
        F.mse_loss(hn.zeros(4, 1), hn.zeros(4))
    assert "[4, 1]" in str(info.value) and "[4]" in str(info.value)
    with pytest.raises(hn.ShapeError, match="l1_loss"):
        F.l1_loss(hn.zeros(3), hn.zeros(2))
    with pytest.raises(hn.ShapeError):
        F.binary_cross_entropy_with_logits(hn.zeros(3), hn.zeros(3, 1))
    with pytest.raises(ValueError, match="reduction"):
        F.mse_loss(hn.zeros(3), hn.zeros(3), reduction="avg")
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(logits, hn.tensor([0, 1, 2, 1]), reduction="avg")


# ---- the dedicated comparison with PyTorch -------------------------------------------------


def test_losses_against_torch():
    import torch
    tf = torch.nn.functional
    rng = np.random.default_rng(7)
    checked = 0
    for shape_kind in ("2d", "3d", "4d", "1d"):
        for weight, ignored, smoothing in CE_OPTIONS:
            for reduction in REDUCTIONS:
                logits, target = _case(shape_kind, rng, ignored)
                w = None if weight is None else torch.from_numpy(weight)
                ref = tf.cross_entropy(torch.from_numpy(logits), torch.from_numpy(target),
                                       weight=w, reduction=reduction,
                                       label_smoothing=smoothing)
                mine = F.cross_entropy(hn.tensor(logits), hn.tensor(target),
                                       weight=None if weight is None else hn.tensor(weight),
                                       reduction=reduction, label_smoothing=smoothing)
                assert mine.shape == tuple(ref.shape), (shape_kind, reduction)
                np.testing.assert_allclose(np_of(mine), ref.numpy(), **TOL)
                checked += 1
    x, y = 50 * rng.standard_normal((6, 3)), rng.uniform(0, 1, (6, 3))
    pw = rng.uniform(0.5, 3, 3)
    for reduction in REDUCTIONS:
        ref = tf.binary_cross_entropy_with_logits(torch.from_numpy(x), torch.from_numpy(y),
                                                  reduction=reduction,
                                                  pos_weight=torch.from_numpy(pw))
        mine = F.binary_cross_entropy_with_logits(hn.tensor(x), hn.tensor(y),
                                                  reduction=reduction, pos_weight=hn.tensor(pw))
        np.testing.assert_allclose(np_of(mine), ref.numpy(), rtol=1e-10, atol=1e-10)
        for ours, theirs in ((F.mse_loss, tf.mse_loss), (F.l1_loss, tf.l1_loss)):
            np.testing.assert_allclose(
                np_of(ours(hn.tensor(x), hn.tensor(y), reduction=reduction)),
                theirs(torch.from_numpy(x), torch.from_numpy(y), reduction=reduction).numpy(),
                **TOL)
        logp = log_softmax(x, 1)
        tgt = rng.integers(0, 3, 6)
        np.testing.assert_allclose(
            np_of(F.nll_loss(hn.tensor(logp), hn.tensor(tgt), reduction=reduction)),
            tf.nll_loss(torch.from_numpy(logp), torch.from_numpy(tgt), reduction=reduction),
            **TOL)
    assert checked == 4 * len(CE_OPTIONS) * 3


if importlib.util.find_spec("torch") is None:  # compared with PyTorch only where it is installed
    del test_losses_against_torch
