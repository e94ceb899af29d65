"""`kl_divergence(p, q)` and `register_kl`, as torch.distributions.kl."""

import math

from .. import functional as _f
from .bernoulli import Bernoulli
from .categorical import Categorical
from .independent import Independent
from .normal import Normal
from .utils import sum_rightmost

__all__ = ["kl_divergence", "register_kl"]

_KL_REGISTRY = {}


def register_kl(type_p, type_q):
    """Decorator registering `fn(p, q)` as KL(p || q) for p of type_p and q of type_q."""
    def decorator(fn):
        _KL_REGISTRY[type_p, type_q] = fn
        return fn
    return decorator


def _dispatch(type_p, type_q):
    best, rank = None, None
    for (tp, tq), fn in _KL_REGISTRY.items():
        if issubclass(type_p, tp) and issubclass(type_q, tq):
            r = (type_p.__mro__.index(tp), type_q.__mro__.index(tq))
            if rank is None or r < rank:
                best, rank = fn, r
    return best


def kl_divergence(p, q):
    """KL(p || q), batched over the batch shape; NotImplementedError for an unregistered
    pair of types."""
    fn = _dispatch(type(p), type(q))
    if fn is None:
        raise NotImplementedError(f"No KL(p || q) is implemented for p type "
                                  f"{p.__class__.__name__} and q type {q.__class__.__name__}")
    return fn(p, q)


def _softplus(x):
    """log(1 + exp(x)), stable (log(1 + exp(-|x|)) + max(x, 0))."""
    abs_x = _f.where(x >= 0, x, -x)
    return _f.log(1.0 + _f.exp(-abs_x)) + (abs_x + x) * 0.5


@register_kl(Bernoulli, Bernoulli)
def _kl_bernoulli_bernoulli(p, q):
    t1 = p.probs * (_softplus(-q.logits) - _softplus(-p.logits))
    t1 = _f.where(p.probs == 0, 0.0, _f.where(q.probs == 0, math.inf, t1))
    t2 = (1 - p.probs) * (_softplus(q.logits) - _softplus(p.logits))
    t2 = _f.where(p.probs == 1, 0.0, _f.where(q.probs == 1, math.inf, t2))
    return t1 + t2


@register_kl(Categorical, Categorical)
def _kl_categorical_categorical(p, q):
    t = p.probs * (p.logits - q.logits)
    t = _f.where(p.probs == 0, 0.0, _f.where(q.probs == 0, math.inf, t))
    return _f.sum(t, -1)


@register_kl(Normal, Normal)
def _kl_normal_normal(p, q):
    var_ratio = (p.scale / q.scale).pow(2)
    t1 = ((p.loc - q.loc) / q.scale).pow(2)
    return 0.5 * (var_ratio + t1 - 1 - _f.log(var_ratio))


@register_kl(Independent, Independent)
def _kl_independent_independent(p, q):
    if p.reinterpreted_batch_ndims != q.reinterpreted_batch_ndims:
        raise NotImplementedError("kl_divergence: Independent distributions with different "
                                  "reinterpreted_batch_ndims")
    result = kl_divergence(p.base_dist, q.base_dist)
    return sum_rightmost(result, p.reinterpreted_batch_ndims)
