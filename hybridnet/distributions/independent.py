"""`Independent`: batch dims reinterpreted as event dims, as torch.distributions.Independent."""

from . import constraints
from .distribution import Distribution
from .utils import sum_rightmost

__all__ = ["Independent"]


class Independent(Distribution):
    """`base_distribution` with its rightmost `reinterpreted_batch_ndims` batch dims made
    event dims: log_prob and entropy sum over them (e.g. a diagonal Gaussian policy:
    `Independent(Normal(mu, std), 1)`)."""

    arg_constraints = {}

    def __init__(self, base_distribution, reinterpreted_batch_ndims, validate_args=None):
        if reinterpreted_batch_ndims > len(base_distribution.batch_shape):
            raise ValueError(
                f"Expected reinterpreted_batch_ndims <= len(base_distribution.batch_shape), "
                f"actual {reinterpreted_batch_ndims} vs {len(base_distribution.batch_shape)}")
        shape = base_distribution.batch_shape + base_distribution.event_shape
        event_dim = reinterpreted_batch_ndims + len(base_distribution.event_shape)
        batch_shape = shape[:len(shape) - event_dim]
        event_shape = shape[len(shape) - event_dim:]
        self.base_dist = base_distribution
        self.reinterpreted_batch_ndims = reinterpreted_batch_ndims
        super().__init__(batch_shape, event_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        """An Independent over the base distribution expanded to `batch_shape`."""
        new = self._get_checked_instance(Independent, _instance)
        batch_shape = tuple(batch_shape)
        new.base_dist = self.base_dist.expand(
            batch_shape + self.event_shape[:self.reinterpreted_batch_ndims])
        new.reinterpreted_batch_ndims = self.reinterpreted_batch_ndims
        super(Independent, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def has_rsample(self):  # noqa: D102
        return self.base_dist.has_rsample

    @property
    def has_enumerate_support(self):  # noqa: D102
        if self.reinterpreted_batch_ndims > 0:
            return False
        return self.base_dist.has_enumerate_support

    @constraints.dependent_property
    def support(self):
        """The base support with the reinterpreted dims folded into the event."""
        result = self.base_dist.support
        if self.reinterpreted_batch_ndims:
            result = constraints.independent(result, self.reinterpreted_batch_ndims)
        return result

    @property
    def mean(self):
        """The base mean."""
        return self.base_dist.mean

    @property
    def mode(self):
        """The base mode."""
        return self.base_dist.mode

    @property
    def variance(self):
        """The base variance."""
        return self.base_dist.variance

    def sample(self, sample_shape=()):
        """The base sample."""
        return self.base_dist.sample(sample_shape)

    def rsample(self, sample_shape=()):
        """The base rsample."""
        return self.base_dist.rsample(sample_shape)

    def log_prob(self, value):
        """The base log_prob summed over the reinterpreted dims."""
        return sum_rightmost(self.base_dist.log_prob(value), self.reinterpreted_batch_ndims)

    def entropy(self):
        """The base entropy summed over the reinterpreted dims."""
        return sum_rightmost(self.base_dist.entropy(), self.reinterpreted_batch_ndims)

    def enumerate_support(self, expand: bool = True):
        """The base support (only when no dims are reinterpreted)."""
        if self.reinterpreted_batch_ndims > 0:
            raise NotImplementedError("Enumeration over cartesian product is not implemented")
        return self.base_dist.enumerate_support(expand=expand)

    def __repr__(self):
        return f"{self.__class__.__name__}({self.base_dist}, {self.reinterpreted_batch_ndims})"
