"""`Normal`: the Gaussian, as torch.distributions.Normal."""

import math

import numpy as np

from .. import functional as _f
from .. import shape as _s
from ..creation import generator
from ..tensor import wrap
from . import constraints
from .distribution import Distribution
from .utils import NUMBER, broadcast_all

__all__ = ["Normal"]

_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


class Normal(Distribution):
    """A normal distribution with mean `loc` and standard deviation `scale` (tensors or
    Python numbers, broadcast together).

    rsample() is loc + scale * eps with eps ~ N(0, 1) from hybridnet's global generator,
    so gradients flow to loc and scale; sample() is the same draw without gradient.
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale = broadcast_all(loc, scale)
        if isinstance(loc, NUMBER) and isinstance(scale, NUMBER):
            batch_shape = ()
        else:
            batch_shape = self.loc.shape
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        """A Normal with parameters expanded to `batch_shape` (no re-validation)."""
        new = self._get_checked_instance(Normal, _instance)
        batch_shape = tuple(batch_shape)
        new.loc = _s.expand(self.loc, *batch_shape)
        new.scale = _s.expand(self.scale, *batch_shape)
        super(Normal, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        """loc."""
        return self.loc

    @property
    def mode(self):
        """loc."""
        return self.loc

    @property
    def stddev(self):
        """scale."""
        return self.scale

    @property
    def variance(self):
        """scale ** 2."""
        return self.stddev.pow(2)

    def rsample(self, sample_shape=()):
        """loc + eps * scale, eps standard normal of shape sample_shape + batch_shape
        (a reparameterized sample: differentiable in loc and scale)."""
        shape = self._extended_shape(sample_shape)
        eps = generator().standard_normal(shape).astype(self.loc._data.dtype)
        return self.loc + wrap(np.asarray(eps)) * self.scale

    def log_prob(self, value):
        """-(value - loc)**2 / (2 scale**2) - log(scale) - log(sqrt(2 pi))."""
        if self._validate_args:
            self._validate_sample(value)
        var = self.scale ** 2
        return -((value - self.loc) ** 2) / (2 * var) - _f.log(self.scale) - _LOG_SQRT_2PI

    def cdf(self, value):
        """0.5 * (1 + erf((value - loc) / (scale * sqrt(2))))."""
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 * (1 + _f.erf((value - self.loc) * _f.reciprocal(self.scale)
                                 / math.sqrt(2)))

    def entropy(self):
        """0.5 + 0.5 * log(2 pi) + log(scale)."""
        return 0.5 + 0.5 * math.log(2 * math.pi) + _f.log(self.scale)
