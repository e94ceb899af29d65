"""hybridnet.distributions against torch.distributions (the oracle).

Each case in CASES is built in both libraries from the same parameters (float64, so
values and gradients agree to rounding): shapes, moments, log_prob, entropy, their
gradients, samples (shapes, dtypes, support, statistics, reproducibility), validation
errors, KL divergences, Independent, tracing, and a REINFORCE / actor-critic step.
"""

import math
import re
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.distributions as td

import hybridnet as hn
import hybridnet.nn as nn
import hybridnet.nn.functional as F
from hybridnet import distributions as hd

_rng = np.random.default_rng(20240611)


def _unnorm(*shape):
    return _rng.uniform(0.05, 2.0, shape)


def _normal(*shape, scale=1.0):
    return _rng.normal(size=shape) * scale


def _ints(shape, k):
    return _rng.integers(0, k, shape)


def _bits(*shape):
    return _rng.integers(0, 2, shape).astype(np.float64)


@dataclass
class Case:
    """One distribution built from `params` (ndarrays become tensors, floats stay
    Python numbers), scored at `values`."""

    id: str
    family: str
    params: dict
    values: np.ndarray

    def __repr__(self):
        return self.id

    @property
    def tol(self) -> dict:
        """Tolerances: float32 ones when a Python float made a float32 parameter."""
        if all(isinstance(v, np.ndarray) for v in self.params.values()):
            return {}
        return {"rtol": 2e-6, "atol": 1e-6}


CASES = [
    Case("cat-probs-1d", "Categorical", {"probs": _unnorm(4)}, _ints((6,), 4)),
    Case("cat-probs-batch", "Categorical", {"probs": _unnorm(2, 3, 4)}, _ints((5, 2, 3), 4)),
    Case("cat-logits", "Categorical", {"logits": _normal(3, 5, scale=3.0)}, _ints((3,), 5)),
    Case("cat-logits-bcast", "Categorical", {"logits": _normal(3, 5)}, _ints((2, 1), 5)),
    Case("cat-logits-extreme", "Categorical",
         {"logits": np.array([[50.0, -50.0, 0.0], [-math.inf, 0.0, 1.0]])},
         np.array([[0, 2], [2, 1]])),
    Case("cat-probs-zero", "Categorical", {"probs": np.array([0.0, 0.3, 0.7])},
         np.array([1, 2, 2])),
    Case("bern-probs", "Bernoulli", {"probs": _rng.uniform(0.05, 0.95, 4)}, _bits(3, 4)),
    Case("bern-logits", "Bernoulli",
         {"logits": np.array([[-30.0, -1.0, 0.0], [0.5, 2.0, 30.0]])}, _bits(2, 3)),
    Case("bern-half", "Bernoulli", {"probs": np.array([0.5, 0.7, 0.2])}, _bits(3)),
    Case("bern-float", "Bernoulli", {"probs": 0.3}, np.array([0.0, 1.0, 1.0])),
    Case("bern-logit-float", "Bernoulli", {"logits": -0.7}, np.array([1.0, 0.0])),
    Case("normal", "Normal", {"loc": _normal(3), "scale": _rng.uniform(0.5, 2, 3)},
         _normal(4, 3)),
    Case("normal-float-scale", "Normal", {"loc": _normal(2, 3), "scale": 0.7}, _normal(2, 3)),
    Case("normal-float-loc", "Normal", {"loc": 1.5, "scale": _rng.uniform(0.5, 2, 3)},
         _normal(3)),
    Case("normal-floats", "Normal", {"loc": 0.5, "scale": 2.0}, _normal(5)),
    Case("normal-bcast", "Normal", {"loc": _normal(3, 1), "scale": _rng.uniform(0.5, 2, 4)},
         _normal(3, 4)),
]


def build(lib, case, dtype="float64", requires_grad=True, **kw):
    """(distribution, {param name: leaf tensor}) in `lib` ('hn' or 'torch')."""
    mod, leaves, kwargs = (hd if lib == "hn" else td), {}, dict(kw)
    for name, v in case.params.items():
        if isinstance(v, np.ndarray):
            if lib == "hn":
                t = hn.tensor(v, dtype=getattr(hn, dtype), requires_grad=requires_grad)
            else:
                t = torch.tensor(v, dtype=getattr(torch, dtype), requires_grad=requires_grad)
            leaves[name] = kwargs[name] = t
        else:
            kwargs[name] = v
    return getattr(mod, case.family)(**kwargs), leaves


def value(lib, case, dtype="float64"):
    """The case's values as a tensor: int64 class indices or floats."""
    v = case.values
    if case.family == "Categorical":
        return hn.tensor(v.astype(np.int64)) if lib == "hn" else torch.tensor(v, dtype=torch.int64)
    return hn.tensor(v, dtype=getattr(hn, dtype)) if lib == "hn" else torch.tensor(
        v, dtype=getattr(torch, dtype))


def arr(t):
    """NumPy values of a hybridnet or torch tensor."""
    return t.detach().numpy()


def close(got, want, rtol=1e-9, atol=1e-10):
    """Values (and shapes) agree; NaNs match NaNs."""
    g, w = arr(got), arr(want)
    assert g.shape == w.shape, (g.shape, w.shape)
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


# ---- shapes, moments, log_prob, entropy ------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_shapes_and_moments(case):
    d, _ = build("hn", case)
    t, _ = build("torch", case)
    assert d.batch_shape == tuple(t.batch_shape) and d.event_shape == tuple(t.event_shape)
    assert (d.has_rsample, d.has_enumerate_support) == (t.has_rsample, t.has_enumerate_support)
    for name in ("mean", "variance", "stddev", "mode"):
        got, want = getattr(d, name), getattr(t, name)
        close(got, want, **case.tol)
        assert (got.dtype == hn.int64) == (want.dtype == torch.int64), name
    if case.family == "Categorical":
        close(d.probs, t.probs)
        close(d.logits, t.logits)
        assert d.param_shape == tuple(t.param_shape)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_log_prob_entropy_perplexity(case):
    d, _ = build("hn", case)
    t, _ = build("torch", case)
    close(d.log_prob(value("hn", case)), t.log_prob(value("torch", case)), **case.tol)
    close(d.entropy(), t.entropy(), **case.tol)
    close(d.perplexity(), t.perplexity(), **case.tol)


@pytest.mark.parametrize("case", [c for c in CASES if any(
    isinstance(v, np.ndarray) for v in c.params.values())], ids=repr)
def test_gradients_of_log_prob_and_entropy(case):
    d, leaves = build("hn", case)
    t, tleaves = build("torch", case)
    lp_t, ent_t = t.log_prob(value("torch", case)), t.entropy()
    w1 = np.random.default_rng(1).normal(size=tuple(lp_t.shape))
    w2 = np.random.default_rng(2).normal(size=tuple(ent_t.shape))
    (lp_t * torch.tensor(w1)).sum().add((ent_t * torch.tensor(w2)).sum()).backward()
    loss = (d.log_prob(value("hn", case)) * hn.tensor(w1)).sum() + (
        d.entropy() * hn.tensor(w2)).sum()
    loss.backward()
    for name, leaf in leaves.items():
        assert leaf.grad is not None, name
        np.testing.assert_allclose(arr(leaf.grad), arr(tleaves[name].grad), rtol=1e-8,
                                   atol=1e-10, err_msg=name)


@pytest.mark.parametrize("case", [c for c in CASES if c.id in (
    "cat-logits", "cat-probs-batch", "bern-logits", "bern-probs", "normal", "normal-floats")],
    ids=repr)
def test_float32_follows_torch(case):
    d, _ = build("hn", case, "float32")
    t, _ = build("torch", case, "float32")
    lp = d.log_prob(value("hn", case, "float32"))
    assert lp.dtype == hn.float32 and d.entropy().dtype == hn.float32
    close(lp, t.log_prob(value("torch", case, "float32")), rtol=2e-5, atol=2e-5)
    close(d.entropy(), t.entropy(), rtol=2e-5, atol=2e-5)


def test_normal_cdf_matches_torch_with_gradients():
    loc, scale, x = _normal(2, 3), _rng.uniform(0.5, 2, (2, 3)), _normal(4, 2, 3, scale=2.0)
    hl, hs = (hn.tensor(a, dtype=hn.float64, requires_grad=True) for a in (loc, scale))
    tl, ts = (torch.tensor(a, requires_grad=True) for a in (loc, scale))
    got = hd.Normal(hl, hs).cdf(hn.tensor(x, dtype=hn.float64))
    want = td.Normal(tl, ts).cdf(torch.tensor(x))
    close(got, want)
    got.sum().backward()
    want.sum().backward()
    close(hl.grad, tl.grad)
    close(hs.grad, ts.grad)


# ---- sampling ---------------------------------------------------------------------------


@pytest.mark.parametrize("sample_shape", [(), (5,), (2, 3)], ids=str)
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_sample_shape_dtype_support_no_grad(case, sample_shape):
    d, _ = build("hn", case)
    t, _ = build("torch", case)
    s = d.sample(sample_shape)
    assert s.shape == tuple(t.sample(sample_shape).shape) == sample_shape + d.batch_shape
    assert not s.requires_grad and s.grad_fn is None
    if case.family == "Categorical":
        assert s.dtype == hn.int64
        assert s.numpy().min() >= 0 and s.numpy().max() < d.param_shape[-1]
    else:
        assert s.dtype == d.mean.dtype  # the parameters' dtype (float32 from Python floats)
    if case.family == "Bernoulli":
        assert set(np.unique(s.numpy())) <= {0.0, 1.0}
    d.log_prob(s)  # every sample lies in the support (validation is on)


def test_sample_shape_must_be_a_tuple():
    d = hd.Normal(0.0, 1.0)
    with pytest.raises(TypeError, match=r"sample_shape must be a tuple"):
        d.sample(5)
    assert d.sample([2, 3]).shape == (2, 3)
    assert d.sample(torch.Size([4])).shape == (4,)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_samples_reproducible_under_manual_seed(case):
    d, _ = build("hn", case)
    hn.manual_seed(123)
    first = d.sample((50,)).numpy().copy()
    hn.manual_seed(123)
    again = d.sample((50,)).numpy().copy()
    np.testing.assert_array_equal(first, again)
    if case.family == "Normal":
        assert not np.array_equal(first, d.sample((50,)).numpy())


def test_rsample_and_sample_draw_the_same_values():
    d = hd.Normal(hn.tensor([0.5, -1.0]), hn.tensor([2.0, 0.1]))
    hn.manual_seed(9)
    a = d.sample((3,)).numpy().copy()
    hn.manual_seed(9)
    np.testing.assert_array_equal(a, d.rsample((3,)).detach().numpy())


def test_randomness_comes_from_the_global_generator():
    hn.manual_seed(5)
    hd.Categorical(logits=hn.zeros(3)).sample((4,))
    after_cat = hn.rand(2).numpy().copy()
    hn.manual_seed(5)
    hn.creation.generator().random((4, 1))  # what one categorical draw of 4 consumes
    np.testing.assert_array_equal(after_cat, hn.rand(2).numpy())


N_STAT = 40000


@pytest.mark.parametrize("family,params", [
    ("Categorical", {"probs": np.array([[0.1, 0.2, 0.3, 0.4], [0.0, 0.5, 0.0, 0.5]])}),
    ("Categorical", {"logits": np.array([2.0, -1.0, 0.0, 0.5, -3.0])}),
    ("Bernoulli", {"probs": np.array([0.05, 0.5, 0.9, 1.0, 0.0])}),
    ("Bernoulli", {"logits": np.array([-2.0, 0.3])}),
], ids=["cat-probs", "cat-logits", "bern-probs", "bern-logits"])
def test_discrete_sample_frequencies(family, params):
    hn.manual_seed(0)
    d, _ = build("hn", Case("s", family, params, np.zeros(1)), requires_grad=False)
    s = d.sample((N_STAT,)).numpy()
    probs = d.probs.numpy()
    if family == "Categorical":
        freq = np.stack([(s == k).mean(0) for k in range(probs.shape[-1])], -1)
    else:
        freq = s.mean(0)
    se = np.sqrt(probs * (1 - probs) / N_STAT)
    assert np.all(np.abs(freq - probs) <= 5 * se + 1e-12), (freq, probs)
    assert np.all(freq[probs == 0] == 0)  # a zero-probability outcome is never drawn


@pytest.mark.parametrize("method", ["sample", "rsample"])
def test_normal_sample_mean_and_std(method):
    hn.manual_seed(1)
    loc, scale = np.array([[0.0, -3.0, 10.0]]), np.array([1.0, 0.2, 5.0])
    d = hd.Normal(hn.tensor(loc), hn.tensor(scale))
    s = getattr(d, method)((N_STAT, 2)).detach().numpy()
    assert s.shape == (N_STAT, 2, 1, 3)
    flat = s.reshape(-1, 3)
    n = flat.shape[0]
    assert np.all(np.abs(flat.mean(0) - loc[0]) <= 5 * scale / math.sqrt(n))
    # the sample std: standard error about scale / sqrt(2n)
    assert np.all(np.abs(flat.std(0) - scale) <= 5 * scale / math.sqrt(2 * n))


def test_rsample_gradients_match_torch():
    loc, scale = _normal(3), _rng.uniform(0.5, 2, 3)
    hl, hs = (hn.tensor(a, dtype=hn.float64, requires_grad=True) for a in (loc, scale))
    hn.manual_seed(3)
    x = hd.Normal(hl, hs).rsample((7,))
    assert x.grad_fn is not None and x.shape == (7, 3)
    (hn.sin(x) * x).mean().backward()
    eps = (arr(x) - loc) / scale  # the standard normal draw behind x
    tl, ts = (torch.tensor(a, requires_grad=True) for a in (loc, scale))
    tx = tl + torch.tensor(eps) * ts
    (torch.sin(tx) * tx).mean().backward()
    close(hl.grad, tl.grad)
    close(hs.grad, ts.grad)


def test_only_normal_has_rsample():
    with pytest.raises(NotImplementedError, match="rsample"):
        hd.Categorical(logits=hn.zeros(3)).rsample()
    with pytest.raises(NotImplementedError, match="rsample"):
        hd.Bernoulli(0.5).rsample()


def test_categorical_sample_rejects_bad_probs_without_validation():
    d = hd.Categorical(probs=hn.tensor([0.5, math.nan]), validate_args=False)
    with pytest.raises(RuntimeError, match="inf, nan or element < 0"):
        d.sample()


# ---- validation ------------------------------------------------------------------------

_T = object()  # marks "a tensor of the following values" in the table below


def _mk(lib, x):
    if isinstance(x, tuple) and x and x[0] is _T:
        return hn.tensor(x[1], dtype=hn.float64) if lib == "hn" else torch.tensor(
            x[1], dtype=torch.float64)
    if isinstance(x, tuple) and x and x[0] == "int":
        return hn.tensor(x[1]) if lib == "hn" else torch.tensor(x[1])
    return x


INVALID = [  # (family, kwargs, value for log_prob or None, message pattern)
    ("Categorical", {"probs": (_T, [-0.1, 1.1])}, None, r"Expected parameter probs .*Simplex"),
    ("Categorical", {"probs": (_T, [0.0, 0.0])}, None, r"Expected parameter probs"),
    ("Categorical", {"probs": (_T, [math.nan, 1.0])}, None, r"Expected parameter probs"),
    ("Categorical", {"logits": (_T, [math.nan, 0.0])}, None,
     r"Expected parameter logits .*IndependentConstraint\(Real\(\), 1\)"),
    ("Categorical", {}, None, r"Either `probs` or `logits` must be specified"),
    ("Categorical", {"probs": (_T, [1.0]), "logits": (_T, [1.0])}, None, r"but not both"),
    ("Categorical", {"probs": (_T, 1.0)}, None, r"must be at least one-dimensional"),
    ("Categorical", {"logits": (_T, [0.0, 1.0, 2.0])}, ("int", [0, 3]),
     r"Expected value argument .*within the support \(IntegerInterval\(lower_bound=0, "
     r"upper_bound=2\)\)"),
    ("Categorical", {"logits": (_T, [0.0, 1.0, 2.0])}, ("int", [-1]), r"within the support"),
    ("Categorical", {"logits": (_T, [0.0, 1.0, 2.0])}, (_T, [1.5]), r"within the support"),
    ("Categorical", {"logits": (_T, [[0.0, 1.0]] * 3)}, ("int", [0, 1]),
     r"Value is not broadcastable with batch_shape\+event_shape"),
    ("Categorical", {"logits": (_T, [0.0, 1.0])}, 1, r"argument to log_prob must be a Tensor"),
    ("Bernoulli", {"probs": 1.5}, None, r"Expected parameter probs .*Interval\(lower_bound=0.0"),
    ("Bernoulli", {"probs": (_T, [0.2, -0.1])}, None, r"Expected parameter probs"),
    ("Bernoulli", {"logits": math.nan}, None, r"Expected parameter logits .*Real\(\)"),
    ("Bernoulli", {}, None, r"Either `probs` or `logits` must be specified"),
    ("Bernoulli", {"probs": 0.3}, (_T, [0.5]), r"within the support \(Boolean\(\)\)"),
    ("Normal", {"loc": 0.0, "scale": -1.0}, None,
     r"Expected parameter scale \(Tensor of shape \(\)\) of distribution Normal\(.*GreaterThan"
     r"\(lower_bound=0.0\), but found invalid values"),
    ("Normal", {"loc": (_T, [0.0, 1.0]), "scale": (_T, [1.0, 0.0])}, None,
     r"Expected parameter scale \(Tensor of shape \(2,\)\)"),
    ("Normal", {"loc": (_T, [math.nan]), "scale": 1.0}, None, r"Expected parameter loc"),
    ("Normal", {"loc": (_T, [0.0, 1.0]), "scale": 1.0}, (_T, [math.nan, 0.0]),
     r"within the support \(Real\(\)\)"),
    ("Normal", {"loc": (_T, [0.0, 1.0, 2.0]), "scale": 1.0}, (_T, [0.0, 1.0]),
     r"not broadcastable"),
    ("Normal", {"loc": 0.0, "scale": 1.0}, 0.5, r"must be a Tensor"),
]


@pytest.mark.parametrize("family,kwargs,val,pattern", INVALID,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(INVALID)])
def test_validation_errors_like_torch(family, kwargs, val, pattern):
    messages = {}
    for lib, mod in (("torch", td), ("hn", hd)):
        args = {k: _mk(lib, v) for k, v in kwargs.items()}
        with pytest.raises(ValueError) as info:
            d = getattr(mod, family)(**args)
            d.log_prob(_mk(lib, val))
        messages[lib] = str(info.value)
    assert re.search(pattern, messages["hn"], re.S), messages["hn"]
    # the same error as torch's, up to how shapes and tensors are printed
    assert messages["hn"].split(":")[0] == messages["torch"].split(":")[0], messages


def test_validate_args_false_and_default_switch():
    d = hd.Normal(0.0, -1.0, validate_args=False)
    assert math.isnan(d.log_prob(hn.tensor(0.5)).item())
    hd.Categorical(probs=hn.tensor([-1.0, 2.0]), validate_args=False)
    assert hd.Categorical(logits=hn.zeros(3), validate_args=False).log_prob(
        hn.tensor(1.0)).item() == pytest.approx(-math.log(3))
    try:
        hd.Distribution.set_default_validate_args(False)
        hd.Bernoulli(probs=2.0)
        assert hd.Bernoulli(probs=0.5, validate_args=True)._validate_args
        with pytest.raises(ValueError):
            hd.Bernoulli(probs=2.0, validate_args=True)
    finally:
        hd.Distribution.set_default_validate_args(True)
    with pytest.raises(ValueError):
        hd.Bernoulli(probs=2.0)


def test_bad_parameter_types():
    with pytest.raises(TypeError, match="must be a hybridnet Tensor"):
        hd.Categorical(probs=[0.5, 0.5])
    with pytest.raises(ValueError, match="Number or hybridnet.Tensor"):
        hd.Normal([0.0], 1.0)
    with pytest.raises(hn.ShapeError, match="cannot be broadcast"):
        hd.Normal(hn.zeros(2), hn.ones(3))


def test_repr_and_constraints():
    assert repr(hd.Normal(hn.zeros(2), hn.ones(2))) == "Normal(loc: (2,), scale: (2,))"
    assert repr(hd.Categorical(probs=hn.ones(2, 3))) == "Categorical(probs: (2, 3))"
    assert repr(hd.constraints.positive) == repr(td.constraints.positive)
    assert repr(hd.constraints.simplex) == repr(td.constraints.simplex)
    assert repr(hd.constraints.real_vector) == repr(td.constraints.real_vector)
    assert repr(hd.Categorical(logits=hn.zeros(3)).support) == repr(
        td.Categorical(logits=torch.zeros(3)).support)
    assert hd.constraints.is_dependent(hd.Categorical.support)
    x = np.array([-1.0, 0.0, 0.5, 1.0, 2.0, math.nan, math.inf])
    for name in ("real", "positive", "nonnegative", "unit_interval", "boolean"):
        got = getattr(hd.constraints, name).check(hn.tensor(x, dtype=hn.float64)).numpy()
        want = getattr(td.constraints, name).check(torch.tensor(x)).numpy()
        np.testing.assert_array_equal(got, want, err_msg=name)


# ---- expand, enumerate_support, Independent, KL ----------------------------------------


@pytest.mark.parametrize("case", [c for c in CASES if c.id in (
    "cat-probs-1d", "cat-logits", "bern-probs", "bern-float", "normal", "normal-floats")],
    ids=repr)
def test_expand(case):
    d, _ = build("hn", case)
    t, _ = build("torch", case)
    shape = (2,) + d.batch_shape
    de, te = d.expand(shape), t.expand(torch.Size(shape))
    assert type(de) is type(d) and de.batch_shape == tuple(te.batch_shape) == shape
    x = de.sample((3,))
    assert x.shape == (3,) + shape
    close(de.log_prob(x), te.log_prob(torch.tensor(x.numpy())), **case.tol)
    close(de.entropy(), te.entropy(), **case.tol)


@pytest.mark.parametrize("case", [c for c in CASES if c.family != "Normal"], ids=repr)
@pytest.mark.parametrize("expand", [True, False])
def test_enumerate_support(case, expand):
    d, _ = build("hn", case)
    t, _ = build("torch", case)
    got, want = d.enumerate_support(expand), t.enumerate_support(expand)
    close(got, want)
    assert (got.dtype == hn.int64) == (want.dtype == torch.int64)


def test_independent_diagonal_normal():
    loc, scale = _normal(4, 3), _rng.uniform(0.5, 2, (4, 3))
    hl, hs = (hn.tensor(a, dtype=hn.float64, requires_grad=True) for a in (loc, scale))
    tl, ts = (torch.tensor(a, requires_grad=True) for a in (loc, scale))
    d, t = hd.Independent(hd.Normal(hl, hs), 1), td.Independent(td.Normal(tl, ts), 1)
    assert (d.batch_shape, d.event_shape) == ((4,), (3,)) == (tuple(t.batch_shape),
                                                             tuple(t.event_shape))
    assert d.has_rsample and not d.has_enumerate_support
    x = _normal(2, 4, 3)
    lp, tlp = d.log_prob(hn.tensor(x, dtype=hn.float64)), t.log_prob(torch.tensor(x))
    close(lp, tlp)
    close(d.entropy(), t.entropy())
    close(d.mean, t.mean)
    close(d.variance, t.variance)
    assert d.sample((5,)).shape == (5, 4, 3) and d.rsample().grad_fn is not None
    (lp.sum() + d.entropy().sum()).backward()
    (tlp.sum() + t.entropy().sum()).backward()
    close(hl.grad, tl.grad)
    close(hs.grad, ts.grad)
    with pytest.raises(ValueError, match="Expected reinterpreted_batch_ndims"):
        hd.Independent(hd.Normal(hl, hs), 3)
    with pytest.raises(ValueError, match="not broadcastable|event_shape"):
        d.log_prob(hn.tensor(_normal(4, 2), dtype=hn.float64))
    de = d.expand((2, 4))
    assert (de.batch_shape, de.event_shape) == ((2, 4), (3,))


KL_CASES = [
    ("Normal", {"loc": _normal(3), "scale": _rng.uniform(0.5, 2, 3)},
     {"loc": _normal(3), "scale": _rng.uniform(0.5, 2, 3)}),
    ("Categorical", {"logits": _normal(2, 4)}, {"probs": _unnorm(2, 4)}),
    ("Categorical", {"probs": np.array([0.0, 0.5, 0.5])}, {"probs": np.array([0.2, 0.0, 0.8])}),
    ("Categorical", {"probs": np.array([0.0, 0.5, 0.5])}, {"probs": np.array([0.2, 0.3, 0.5])}),
    ("Bernoulli", {"probs": _rng.uniform(0.05, 0.95, 4)}, {"logits": _normal(4, scale=3.0)}),
    ("Bernoulli", {"probs": np.array([0.0, 1.0, 0.3, 0.3])},
     {"probs": np.array([0.4, 0.4, 0.0, 1.0])}),
]


@pytest.mark.parametrize("family,p,q", KL_CASES, ids=[f"{c[0]}-{i}" for i, c in
                                                       enumerate(KL_CASES)])
def test_kl_divergence(family, p, q):
    hp, hl = build("hn", Case("p", family, p, None))
    hq, _ = build("hn", Case("q", family, q, None))
    tp, tl = build("torch", Case("p", family, p, None))
    tq, _ = build("torch", Case("q", family, q, None))
    got, want = hd.kl_divergence(hp, hq), td.kl_divergence(tp, tq)
    close(got, want)
    if np.all(np.isfinite(arr(want))):
        got.sum().backward()
        want.sum().backward()
        for name, leaf in hl.items():
            close(leaf.grad, tl[name].grad, rtol=1e-8, atol=1e-9)


def test_kl_independent_and_unregistered():
    a, b = _normal(2, 3), _rng.uniform(0.5, 2, (2, 3))
    got = hd.kl_divergence(hd.Independent(hd.Normal(hn.tensor(a), 1.0), 1),
                           hd.Independent(hd.Normal(0.0, hn.tensor(b)), 1))
    want = td.kl_divergence(td.Independent(td.Normal(torch.tensor(a), 1.0), 1),
                            td.Independent(td.Normal(0.0, torch.tensor(b)), 1))
    close(got, want)
    with pytest.raises(NotImplementedError, match="No KL"):
        hd.kl_divergence(hd.Normal(0.0, 1.0), hd.Bernoulli(0.5))


# ---- tracing ---------------------------------------------------------------------------


def _fallbacks(tf):
    return [e["detail"] for e in tf.stats.events if e["kind"] == "fallback"]


def test_traced_log_prob_and_entropy_compile_and_match_eager():
    def loss_fn(logits, actions, returns, mu, log_std, x):
        m = hd.Categorical(logits=logits)
        g = hd.Normal(mu, log_std.exp())
        return ((-m.log_prob(actions) * returns).sum() - 0.01 * m.entropy().sum()
                - g.log_prob(x).sum())

    traced = hn.trace(loss_fn)
    rng = np.random.default_rng(4)
    for _ in range(3):
        args = [hn.tensor(rng.normal(size=(5, 3)), requires_grad=True),
                hn.tensor(rng.integers(0, 3, 5)), hn.tensor(rng.normal(size=5)),
                hn.tensor(rng.normal(size=2), requires_grad=True),
                hn.tensor(rng.normal(size=2), requires_grad=True), hn.tensor(rng.normal(size=2))]
        results = []
        for fn in (traced, loss_fn):
            for a in args:
                a.grad = None
            out = fn(*args)
            out.backward()
            results.append((out.item(), [arr(a.grad) for a in args if a.requires_grad]))
        (got, got_g), (want, want_g) = results
        assert got == pytest.approx(want, rel=1e-6)
        for a, b in zip(got_g, want_g):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    assert traced.stats.compiled_calls >= 2, (traced.stats, _fallbacks(traced))
    # validation inside a compiled trace is a value guard: a bad action still raises
    with pytest.raises(ValueError, match="within the support"):
        traced(args[0], hn.tensor([0, 3, 1, 1, 1]), *args[2:])


def test_traced_sampling_runs_eagerly():
    def act(logits):
        return hd.Categorical(logits=logits).sample((2,))

    traced = hn.trace(act)
    hn.manual_seed(0)
    eager = [act(hn.tensor([0.0, 1.0, 2.0])).numpy().copy() for _ in range(3)]
    hn.manual_seed(0)
    got = [traced(hn.tensor([0.0, 1.0, 2.0])).numpy().copy() for _ in range(3)]
    for a, b in zip(got, eager):
        np.testing.assert_array_equal(a, b)
    assert traced.stats.compiled_calls == 0
    assert any("random" in r for r in _fallbacks(traced)), traced.stats.events


# ---- policy gradients ------------------------------------------------------------------


def _twin_linear(n_in, n_out, seed):
    """An hn.nn.Linear and a torch.nn.Linear with the same float64 weights."""
    rng = np.random.default_rng(seed)
    w, b = rng.normal(size=(n_out, n_in)) * 0.5, rng.normal(size=n_out) * 0.1
    h = nn.Linear(n_in, n_out, dtype=hn.float64)
    h.weight.data = hn.tensor(w, dtype=hn.float64)
    h.bias.data = hn.tensor(b, dtype=hn.float64)
    t = torch.nn.Linear(n_in, n_out, dtype=torch.float64)
    with torch.no_grad():
        t.weight.copy_(torch.tensor(w))
        t.bias.copy_(torch.tensor(b))
    return h, t


def _grads_match(h, t):
    for (name, hp), (_, tp) in zip(h.named_parameters(), t.named_parameters()):
        np.testing.assert_allclose(arr(hp.grad), arr(tp.grad), rtol=1e-8, atol=1e-10,
                                   err_msg=name)


@pytest.mark.parametrize("param", ["probs", "logits"])
def test_reinforce_step_matches_torch(param):
    policy, tpolicy = _twin_linear(4, 3, seed=0)
    states = np.random.default_rng(1).normal(size=(8, 4))
    returns = np.random.default_rng(2).normal(size=8)

    out = policy(hn.tensor(states, dtype=hn.float64))
    m = hd.Categorical(**{param: F.softmax(out, -1) if param == "probs" else out})
    hn.manual_seed(0)
    actions = m.sample()
    assert actions.dtype == hn.int64 and actions.shape == (8,)
    loss = (-m.log_prob(actions) * hn.tensor(returns, dtype=hn.float64)).sum()
    loss.backward()

    tout = tpolicy(torch.tensor(states))
    tm = td.Categorical(**{param: torch.softmax(tout, -1) if param == "probs" else tout})
    tloss = (-tm.log_prob(torch.tensor(actions.numpy())) * torch.tensor(returns)).sum()
    tloss.backward()
    assert loss.item() == pytest.approx(tloss.item(), rel=1e-10)
    _grads_match(policy, tpolicy)


def test_actor_critic_step_matches_torch():
    actor, tactor = _twin_linear(4, 2, seed=3)
    critic, tcritic = _twin_linear(4, 1, seed=4)
    rng = np.random.default_rng(5)
    states, rewards = rng.normal(size=(6, 4)), rng.normal(size=6)

    s = hn.tensor(states, dtype=hn.float64)
    m = hd.Categorical(F.softmax(actor(s), dim=-1))
    values = critic(s).squeeze(-1)
    hn.manual_seed(1)
    actions = m.sample()
    advantage = hn.tensor(rewards, dtype=hn.float64) - values.detach()
    loss = ((-m.log_prob(actions) * advantage).sum()
            + F.smooth_l1_loss(values, hn.tensor(rewards, dtype=hn.float64))
            - 0.01 * m.entropy().mean())
    loss.backward()

    ts = torch.tensor(states)
    tm = td.Categorical(torch.softmax(tactor(ts), dim=-1))
    tvalues = tcritic(ts).squeeze(-1)
    tadv = torch.tensor(rewards) - tvalues.detach()
    tloss = ((-tm.log_prob(torch.tensor(actions.numpy())) * tadv).sum()
             + torch.nn.functional.smooth_l1_loss(tvalues, torch.tensor(rewards))
             - 0.01 * tm.entropy().mean())
    tloss.backward()
    assert loss.item() == pytest.approx(tloss.item(), rel=1e-10)
    _grads_match(actor, tactor)
    _grads_match(critic, tcritic)


def test_gaussian_policy_step_matches_torch():
    """A continuous-action policy: Independent(Normal(mu, std), 1), rsample and log_prob."""
    mu_net, tmu_net = _twin_linear(3, 2, seed=6)
    log_std = hn.tensor([-0.5, 0.2], dtype=hn.float64, requires_grad=True)
    tlog_std = torch.tensor([-0.5, 0.2], dtype=torch.float64, requires_grad=True)
    states = np.random.default_rng(7).normal(size=(5, 3))
    returns = np.random.default_rng(8).normal(size=5)

    d = hd.Independent(hd.Normal(mu_net(hn.tensor(states, dtype=hn.float64)), log_std.exp()), 1)
    hn.manual_seed(2)
    a = d.sample()
    loss = (-d.log_prob(a) * hn.tensor(returns, dtype=hn.float64)).mean() - 0.1 * d.entropy().mean()
    loss.backward()

    td_ = td.Independent(td.Normal(tmu_net(torch.tensor(states)), tlog_std.exp()), 1)
    tloss = ((-td_.log_prob(torch.tensor(a.numpy())) * torch.tensor(returns)).mean()
             - 0.1 * td_.entropy().mean())
    tloss.backward()
    assert loss.item() == pytest.approx(tloss.item(), rel=1e-10)
    _grads_match(mu_net, tmu_net)
    close(log_std.grad, tlog_std.grad)


def test_exported_names():
    assert hn.distributions is hd
    for name in ("Distribution", "Categorical", "Bernoulli", "Normal", "Independent",
                 "kl_divergence", "register_kl", "constraints"):
        assert hasattr(hd, name) and hasattr(td, name), name
        obj = getattr(hd, name)
        assert obj.__doc__, name
