"""Layers against hand-written float64 NumPy references (tests/nn_refs.py)."""

import math

import numpy as np
import pytest
from nn_refs import central_diff, gelu, layer_norm, linear, log_softmax, np_of, sigmoid, softmax

import hybridnet as hn
import hybridnet.nn.functional as F

nn = hn.nn
f64 = hn.float64


def _rand(rng, *shape):
    return rng.standard_normal(shape)


# ---- Linear ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("in_shape", [(5, 4), (2, 3, 4), (4,)])
def test_linear_forward_and_grad_vs_numpy(bias, in_shape):
    rng = np.random.default_rng(1)
    lin = nn.Linear(4, 3, bias=bias, dtype=f64)
    assert lin.weight.shape == (3, 4) and lin.weight.dtype == f64
    assert (lin.bias is None) != bias
    assert len(list(lin.parameters())) == (2 if bias else 1)
    xa = _rand(rng, *in_shape)
    x = hn.tensor(xa, requires_grad=True)
    w, b = np_of(lin.weight), (np_of(lin.bias) if bias else None)
    out = lin(x)
    assert out.dtype == f64 and out.shape == in_shape[:-1] + (3,)
    np.testing.assert_allclose(np_of(out), linear(xa, w, b), rtol=1e-12, atol=1e-12)
    g = _rand(rng, *out.shape)
    (out * hn.tensor(g)).sum().backward()
    g2, x2 = g.reshape(-1, 3), xa.reshape(-1, 4)
    np.testing.assert_allclose(np_of(lin.weight.grad), g2.T @ x2, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np_of(x.grad), g @ w, rtol=1e-12, atol=1e-12)
    if bias:
        np.testing.assert_allclose(np_of(lin.bias.grad), g2.sum(0), rtol=1e-12, atol=1e-12)


def test_linear_float32_matches_float64_reference():
    rng = np.random.default_rng(2)
    lin = nn.Linear(16, 8)
    assert lin.weight.dtype == hn.float32
    xa = _rand(rng, 10, 16).astype(np.float32)
    out = lin(hn.tensor(xa))
    assert out.dtype == hn.float32
    ref = linear(xa.astype(np.float64), np_of(lin.weight).astype(np.float64),
                 np_of(lin.bias).astype(np.float64))
    np.testing.assert_allclose(np_of(out), ref, rtol=1e-5, atol=1e-5)


def test_linear_default_init_bounds():
    hn.manual_seed(0)
    lin = nn.Linear(256, 512)
    bound = 1 / math.sqrt(256)
    w, b = np_of(lin.weight), np_of(lin.bias)
    for name, v in (("weight", w), ("bias", b)):
        assert np.abs(v).max() <= bound, name
        assert np.abs(v).max() > 0.95 * bound, name       # reaches the bound
        assert abs(v.mean()) < 0.1 * bound, name
    assert abs(w.std() - bound / math.sqrt(3)) < 0.02 * bound  # U(-b, b) has std b/sqrt(3)
    assert np.abs(w).max() > 0.999 * bound
    # quartiles of a uniform: the middle half sits within +-b/2
    assert abs(np.mean(np.abs(w) < bound / 2) - 0.5) < 0.01
    hn.manual_seed(0)
    again = nn.Linear(256, 512)
    np.testing.assert_array_equal(np_of(again.weight), w)  # manual_seed repeats init


def test_linear_shape_error():
    with pytest.raises(hn.ShapeError, match="linear"):
        nn.Linear(4, 3)(hn.zeros(2, 5))


# ---- Embedding -----------------------------------------------------------------------------


def test_embedding_forward_and_grad_accumulates():
    emb = nn.Embedding(10, 3, dtype=f64)
    w = np_of(emb.weight)
    idx = np.array([[1, 4, 1], [9, 0, 4]])
    out = emb(hn.tensor(idx))
    assert out.shape == (2, 3, 3) and out.dtype == f64
    np.testing.assert_array_equal(np_of(out), w[idx])
    g = np.random.default_rng(3).standard_normal(out.shape)
    (out * hn.tensor(g)).sum().backward()
    expected = np.zeros_like(w)
    np.add.at(expected, idx, g)
    np.testing.assert_allclose(np_of(emb.weight.grad), expected, rtol=1e-12)
    assert not np_of(emb.weight.grad)[[2, 3, 5, 6, 7, 8]].any()


def test_embedding_default_init_is_standard_normal():
    hn.manual_seed(3)
    w = np_of(nn.Embedding(1000, 50).weight)
    assert abs(w.mean()) < 0.02 and abs(w.std() - 1.0) < 0.02


@pytest.mark.parametrize("padding_idx, row", [(0, 0), (3, 3), (-1, 4)])
def test_embedding_padding_idx(padding_idx, row):
    emb = nn.Embedding(5, 4, padding_idx=padding_idx, dtype=f64)
    assert emb.padding_idx == row
    w = np_of(emb.weight)
    assert not w[row].any()
    assert np.abs(np.delete(w, row, axis=0)).min() > 0
    idx = hn.tensor([row, 1, row, 2])
    out = emb(idx)
    assert not np_of(out)[[0, 2]].any()
    (out * out + out).sum().backward()
    grad = np_of(emb.weight.grad)
    assert not grad[row].any()          # the padding row gets no gradient
    np.testing.assert_allclose(grad[1], 2 * w[1] + 1, rtol=1e-12)


def test_embedding_errors():
    emb = nn.Embedding(5, 2)
    with pytest.raises(hn.DTypeError, match="integer"):
        emb(hn.tensor([1.0, 2.0]))
    with pytest.raises(IndexError, match="7"):
        emb(hn.tensor([1, 7]))


# ---- LayerNorm ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, normalized", [((4, 6), 6), ((2, 3, 5), (3, 5)), ((7,), (7,))])
def test_layer_norm_forward_vs_numpy(shape, normalized):
    rng = np.random.default_rng(4)
    ln = nn.LayerNorm(normalized, dtype=f64)
    norm_shape = (normalized,) if isinstance(normalized, int) else normalized
    assert ln.weight.shape == norm_shape and np.all(np_of(ln.weight) == 1)
    assert not np_of(ln.bias).any()
    with hn.no_grad():
        ln.weight.copy_(hn.tensor(rng.uniform(0.5, 1.5, norm_shape)))
        ln.bias.copy_(hn.tensor(rng.standard_normal(norm_shape)))
    xa = 3.0 + 2.0 * _rand(rng, *shape)
    out = ln(hn.tensor(xa))
    ref = layer_norm(xa, len(norm_shape), np_of(ln.weight), np_of(ln.bias))
    np.testing.assert_allclose(np_of(out), ref, rtol=1e-10, atol=1e-10)
    plain = F.layer_norm(hn.tensor(xa), norm_shape)
    normed = np_of(plain).reshape(-1, int(np.prod(norm_shape)))
    np.testing.assert_allclose(normed.mean(1), 0, atol=1e-10)
    np.testing.assert_allclose(normed.var(1), 1, rtol=1e-4)  # eps=1e-5 shrinks it a bit


def test_layer_norm_without_affine_and_errors():
    ln = nn.LayerNorm(4, elementwise_affine=False)
    assert list(ln.parameters()) == []
    xa = np.arange(8.0).reshape(2, 4)
    np.testing.assert_allclose(np_of(ln(hn.tensor(xa))), layer_norm(xa, 1), rtol=1e-6)
    with pytest.raises(hn.ShapeError, match="normalized_shape"):
        ln(hn.zeros(4, 3))


def test_layer_norm_grad_vs_finite_differences():
    rng = np.random.default_rng(5)
    xa = _rand(rng, 3, 5)
    wa, ba = rng.uniform(0.5, 1.5, 5), _rand(rng, 5)
    ga = _rand(rng, 3, 5)  # loss = sum(g * LN(x))
    x = hn.tensor(xa, requires_grad=True)
    ln = nn.LayerNorm(5, dtype=f64)
    ln.load_state_dict({"weight": wa, "bias": ba})
    (ln(x) * hn.tensor(ga)).sum().backward()

    def loss():
        return float((ga * layer_norm(xa, 1, wa, ba)).sum())

    for arr, grad in ((xa, x.grad), (wa, ln.weight.grad), (ba, ln.bias.grad)):
        grad = np_of(grad)
        for index in np.ndindex(arr.shape):
            fd = central_diff(loss, arr, index)
            assert abs(grad[index] - fd) < 1e-7 + 1e-6 * abs(fd), index


# ---- Dropout ------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.3, 0.7])
def test_dropout_train_statistics_and_scaling(p):
    hn.manual_seed(11)
    drop = nn.Dropout(p)
    xa = np.random.default_rng(0).uniform(1.0, 2.0, 200_000).astype(np.float32)
    out = np_of(drop(hn.tensor(xa)))
    zeroed = out == 0
    assert abs(zeroed.mean() - p) < 0.01
    np.testing.assert_allclose(out[~zeroed], xa[~zeroed] / (1 - p), rtol=1e-6)


def test_dropout_repeatable_with_manual_seed_and_gradient():
    x = hn.ones(64, 64, requires_grad=True)
    hn.manual_seed(5)
    a = F.dropout(x, 0.5)
    hn.manual_seed(5)
    b = F.dropout(x, 0.5)
    c = F.dropout(x, 0.5)  # next draw: a different mask
    np.testing.assert_array_equal(np_of(a), np_of(b))
    assert not np.array_equal(np_of(a), np_of(c))
    a.sum().backward()
    np.testing.assert_array_equal(np_of(x.grad), np_of(a))  # grad = mask / (1 - p)


def test_dropout_eval_identity_edge_probabilities_and_errors():
    x = hn.randn(10, 10)
    drop = nn.Dropout(0.5).eval()
    assert not drop.training
    np.testing.assert_array_equal(np_of(drop(x)), np_of(x))
    np.testing.assert_array_equal(np_of(F.dropout(x, 0.5, training=False)), np_of(x))
    np.testing.assert_array_equal(np_of(nn.Dropout(0.0)(x)), np_of(x))
    assert not np_of(nn.Dropout(1.0)(x)).any()
    for p in (-0.1, 1.5):
        with pytest.raises(ValueError, match="probability"):
            nn.Dropout(p)
        with pytest.raises(ValueError, match="probability"):
            F.dropout(x, p)


# ---- activations, Flatten, Softmax --------------------------------------------------------

ACTIVATIONS = [
    (nn.ReLU(), lambda x: np.maximum(x, 0)),
    (nn.Tanh(), np.tanh),
    (nn.Sigmoid(), sigmoid),
    (nn.SiLU(), lambda x: x * sigmoid(x)),
    (nn.GELU(), gelu),
    (nn.GELU(approximate="tanh"), lambda x: gelu(x, "tanh")),
    (nn.Identity(), lambda x: x),
    (nn.Softmax(dim=1), lambda x: softmax(x, 1)),
    (nn.Softmax(dim=-1), lambda x: softmax(x, -1)),
    (nn.Softmax(dim=0), lambda x: softmax(x, 0)),
    (nn.LogSoftmax(dim=1), lambda x: log_softmax(x, 1)),
]


@pytest.mark.parametrize("module, ref", ACTIVATIONS,
                         ids=[f"{type(m).__name__}{i}" for i, (m, _) in enumerate(ACTIVATIONS)])
def test_activation_modules_vs_numpy(module, ref):
    xa = np.linspace(-6, 6, 60).reshape(3, 4, 5)
    out = module(hn.tensor(xa))
    assert out.shape == xa.shape and out.dtype == f64
    np.testing.assert_allclose(np_of(out), ref(xa), rtol=1e-10, atol=1e-12)
    x32 = hn.tensor(xa.astype(np.float32))
    np.testing.assert_allclose(np_of(module(x32)), ref(xa), rtol=1e-5, atol=1e-6)


def test_functional_activations_match_modules():
    xa = np.linspace(-3, 3, 12).reshape(3, 4)
    x = hn.tensor(xa)
    for fn, mod in ((F.relu, nn.ReLU()), (F.tanh, nn.Tanh()), (F.sigmoid, nn.Sigmoid()),
                    (F.silu, nn.SiLU()), (F.gelu, nn.GELU())):
        np.testing.assert_array_equal(np_of(fn(x)), np_of(mod(x)))
    np.testing.assert_allclose(np_of(F.softmax(x, 1)), softmax(xa, 1), rtol=1e-12)
    np.testing.assert_allclose(np_of(F.log_softmax(x, 0)), log_softmax(xa, 0), rtol=1e-12)


def test_softmax_is_stable_and_normalised():
    xa = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 1000.0]], dtype=np.float32)
    out = np_of(nn.Softmax(dim=1)(hn.tensor(xa)))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out.sum(1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(out, softmax(xa.astype(np.float64), 1), rtol=1e-5, atol=1e-7)


def test_softmax_gradient():
    rng = np.random.default_rng(8)
    xa, ga = _rand(rng, 2, 5), _rand(rng, 2, 5)
    x = hn.tensor(xa, requires_grad=True)
    (nn.Softmax(dim=1)(x) * hn.tensor(ga)).sum().backward()
    s = softmax(xa, 1)
    expected = s * (ga - (ga * s).sum(1, keepdims=True))
    np.testing.assert_allclose(np_of(x.grad), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("start, end, shape", [(1, -1, (2, 60)), (0, -1, (120,)),
                                               (1, 2, (2, 12, 5)), (2, 3, (2, 3, 20))])
def test_flatten(start, end, shape):
    xa = np.arange(120.0).reshape(2, 3, 4, 5)
    flat = nn.Flatten() if (start, end) == (1, -1) else nn.Flatten(start, end)
    out = flat(hn.tensor(xa))
    assert out.shape == shape
    np.testing.assert_array_equal(np_of(out), xa.reshape(shape))


def test_layers_compose_in_a_model():
    hn.manual_seed(1)
    model = nn.Sequential(nn.Embedding(20, 8), nn.LayerNorm(8), nn.Flatten(),
                          nn.Linear(24, 5), nn.GELU(), nn.Dropout(0.2), nn.Linear(5, 2),
                          nn.Softmax(dim=-1))
    model.eval()
    out = model(hn.tensor([[1, 2, 3], [4, 5, 19]]))
    assert out.shape == (2, 2)
    np.testing.assert_allclose(np_of(out).sum(1), 1.0, rtol=1e-6)
    model.train()
    model(hn.tensor([[1, 2, 3]])).max().backward()
    assert model[0].weight.grad is not None and model[3].weight.grad is not None
