"""`Categorical`: one of K classes, as torch.distributions.Categorical."""

import math

import numpy as np

from .. import functional as _f
from .. import shape as _s
from ..creation import generator
from ..tensor import Tensor, literal, wrap
from . import constraints
from .distribution import Distribution
from .utils import lazy_property, logits_to_probs, probs_to_logits

__all__ = ["Categorical"]


def _param(name, value):
    if not isinstance(value, Tensor):
        raise TypeError(f"Categorical: `{name}` must be a hybridnet Tensor, got "
                        f"{type(value).__name__}")
    if value.ndim < 1:
        raise ValueError(f"`{name}` parameter must be at least one-dimensional.")
    return value


class Categorical(Distribution):
    """A categorical distribution over {0, ..., K-1}, from `probs` or `logits` (exactly one).

    `probs` (non-negative, finite, non-zero sum) are normalized over the last dim and
    `logits` (unnormalized log-probabilities) are normalized with logsumexp; `.probs`
    and `.logits` return the normalized values. Leading dims are batch dims. Samples
    are int64 class indices.

    >>> m = Categorical(hn.tensor([0.25, 0.25, 0.25, 0.25]))      # doctest: +SKIP
    >>> action = m.sample(); loss = -m.log_prob(action) * reward  # doctest: +SKIP
    """

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args=None):
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        if probs is not None:
            probs = _param("probs", probs)
            self.probs = probs / _f.sum(probs, -1, keepdim=True)
        else:
            logits = _param("logits", logits)
            self.logits = logits - _f.logsumexp(logits, -1, keepdim=True)
        self._param = self.probs if probs is not None else self.logits
        self._num_events = self._param.shape[-1]
        batch_shape = self._param.shape[:-1]
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        """A Categorical with parameters expanded to `batch_shape` (no re-validation)."""
        new = self._get_checked_instance(Categorical, _instance)
        batch_shape = tuple(batch_shape)
        param_shape = batch_shape + (self._num_events,)
        if "probs" in self.__dict__:
            new.probs = _s.expand(self.probs, *param_shape)
            new._param = new.probs
        if "logits" in self.__dict__:
            new.logits = _s.expand(self.logits, *param_shape)
            new._param = new.logits
        new._num_events = self._num_events
        super(Categorical, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        """Integers 0 .. K-1."""
        return constraints.integer_interval(0, self._num_events - 1)

    @lazy_property
    def logits(self):
        """Normalized log-probabilities (log of the clamped probs when built from probs)."""
        return probs_to_logits(self.probs)

    @lazy_property
    def probs(self):
        """Normalized probabilities (softmax of the logits when built from logits)."""
        return logits_to_probs(self.logits)

    @property
    def param_shape(self) -> tuple:
        """The shape of the parameter given (batch_shape + (K,))."""
        return self._param.shape

    @property
    def mean(self):
        """NaN (undefined for class labels), shaped batch_shape."""
        return self._nan()

    @property
    def mode(self):
        """The most probable class."""
        return _f.argmax(self.probs, -1)

    @property
    def variance(self):
        """NaN (undefined for class labels), shaped batch_shape."""
        return self._nan()

    def _nan(self):
        return literal(np.full(self._extended_shape(), math.nan, self.probs._data.dtype))

    def sample(self, sample_shape=()):
        """int64 class indices of shape sample_shape + batch_shape (from hybridnet's global
        generator: reproducible under hn.manual_seed; never differentiable)."""
        shape = self._extended_shape(sample_shape)
        rng = generator()
        p = self.probs.detach()._data.astype(np.float64)
        cdf = np.cumsum(p, axis=-1)
        total = cdf[..., -1:]
        if not (np.isfinite(p).all() and (p >= 0).all() and (total > 0).all()):
            raise RuntimeError("Categorical.sample: probability tensor contains either inf, "
                               "nan or element < 0, or a row that sums to zero")
        u = rng.random(shape + (1,)) * total  # inverse CDF: a class of zero mass is never hit
        return wrap(np.sum(cdf[..., :-1] <= u, axis=-1).astype(np.int64))

    def log_prob(self, value):
        """log P(value) for int64 class indices `value` (broadcast with batch_shape):
        the normalized logit picked by a one-hot mask, so gradients reach the parameter."""
        if self._validate_args:
            self._validate_sample(value)
        k = self._num_events
        hit = _s.unsqueeze(value.long(), -1) == literal(np.arange(k, dtype=np.int64))
        return _f.sum(_f.where(hit, self.logits, 0.0), -1)

    def entropy(self):
        """-sum(p * log p) over the classes (0 * log 0 taken as 0)."""
        min_real = float(np.finfo(self.logits._data.dtype).min)
        logits = _f.clamp(self.logits, min=min_real)
        return -_f.sum(logits * self.probs, -1)

    def enumerate_support(self, expand: bool = True):
        """Every class as an int64 tensor of shape (K,) + batch_shape ((K, 1, ...) with
        expand=False)."""
        values = literal(np.arange(self._num_events, dtype=np.int64))
        values = _s.reshape(values, (-1,) + (1,) * len(self._batch_shape))
        if expand:
            values = _s.expand(values, (-1,) + self._batch_shape)
        return values

