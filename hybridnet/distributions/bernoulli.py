"""`Bernoulli`: 0 or 1, as torch.distributions.Bernoulli."""

import math

import numpy as np

from .. import functional as _f
from .. import shape as _s
from ..creation import generator
from ..nn.functional import binary_cross_entropy_with_logits
from ..tensor import literal, wrap
from . import constraints
from .distribution import Distribution
from .utils import NUMBER, broadcast_all, lazy_property, logits_to_probs, probs_to_logits

__all__ = ["Bernoulli"]


class Bernoulli(Distribution):
    """A Bernoulli distribution from `probs` (P(1)) or `logits` (log-odds), exactly one.

    Tensors or Python numbers; samples are floats 0.0/1.0 of the parameter's dtype.
    log_prob and entropy are computed from the logits like
    binary_cross_entropy_with_logits, so they stay finite for extreme logits.
    """

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.boolean
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args=None):
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        if probs is not None:
            is_scalar = isinstance(probs, NUMBER)
            (self.probs,) = broadcast_all(probs)
        else:
            is_scalar = isinstance(logits, NUMBER)
            (self.logits,) = broadcast_all(logits)
        self._param = self.probs if probs is not None else self.logits
        batch_shape = () if is_scalar else self._param.shape
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        """A Bernoulli with parameters expanded to `batch_shape` (no re-validation)."""
        new = self._get_checked_instance(Bernoulli, _instance)
        batch_shape = tuple(batch_shape)
        if "probs" in self.__dict__:
            new.probs = _s.expand(self.probs, *batch_shape)
            new._param = new.probs
        if "logits" in self.__dict__:
            new.logits = _s.expand(self.logits, *batch_shape)
            new._param = new.logits
        super(Bernoulli, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        """probs."""
        return self.probs

    @property
    def mode(self):
        """1.0 where probs > 1/2, 0.0 where below, NaN at exactly 1/2."""
        p = self.probs
        return _f.where(p == 0.5, math.nan, (p >= 0.5).to(p.dtype))

    @property
    def variance(self):
        """probs * (1 - probs)."""
        return self.probs * (1 - self.probs)

    @lazy_property
    def logits(self):
        """Log-odds: log(p) - log(1 - p) of the clamped probs when built from probs."""
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self):
        """P(1): sigmoid(logits) when built from logits."""
        return logits_to_probs(self.logits, is_binary=True)

    @property
    def param_shape(self) -> tuple:
        """The shape of the parameter given."""
        return self._param.shape

    def sample(self, sample_shape=()):
        """0.0/1.0 floats of shape sample_shape + batch_shape, from hybridnet's global
        generator (reproducible under hn.manual_seed; never differentiable)."""
        shape = self._extended_shape(sample_shape)
        rng = generator()
        p = self.probs.detach()._data
        u = rng.random(shape)
        return wrap(np.asarray(u < p).astype(p.dtype))

    def log_prob(self, value):
        """-binary_cross_entropy_with_logits(logits, value): stable for any logit."""
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        if value._data.dtype.kind != "f":  # (floats promote with the logits, as in torch)
            value = value.to(logits.dtype)
        return -binary_cross_entropy_with_logits(logits, value, reduction="none")

    def entropy(self):
        """binary_cross_entropy_with_logits(logits, probs)."""
        return binary_cross_entropy_with_logits(self.logits, self.probs, reduction="none")

    def enumerate_support(self, expand: bool = True):
        """0.0 and 1.0 along dim 0: shape (2,) + batch_shape ((2, 1, ...) with expand=False)."""
        values = literal(np.arange(2).astype(self._param._data.dtype))
        values = _s.reshape(values, (-1,) + (1,) * len(self._batch_shape))
        if expand:
            values = _s.expand(values, (-1,) + self._batch_shape)
        return values
