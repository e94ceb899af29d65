"""`Distribution`: the base class, as torch.distributions.Distribution."""

import warnings

from .. import functional as _f
from ..autograd import no_grad
from ..tensor import Tensor
from . import constraints
from .utils import lazy_property

__all__ = ["Distribution"]


def _all_true(valid: Tensor) -> bool:
    """Whether every entry of bool `valid` is True; an op-level check, so a trace guards
    on it instead of reading the data."""
    return valid.numel() == 0 or not bool(_f.sum(~valid) > 0)


def _sample_shape(sample_shape) -> tuple:
    if not isinstance(sample_shape, (tuple, list)):
        raise TypeError(f"sample_shape must be a tuple of ints such as (5,), got "
                        f"{type(sample_shape).__name__}")
    return tuple(int(s) for s in sample_shape)


class Distribution:
    """Abstract base class for probability distributions.

    batch_shape: the shape over which parameters are batched; event_shape: the shape
    of a single sample; validate_args: check parameters (at construction) and values
    (in log_prob, cdf) and raise ValueError when they are invalid. The default is on,
    as in PyTorch; `Distribution.set_default_validate_args(False)` turns it off.
    """

    has_rsample = False
    has_enumerate_support = False
    _validate_args = __debug__

    @staticmethod
    def set_default_validate_args(value: bool) -> None:
        """Set whether validation is on by default (it is, unless Python runs with -O)."""
        if value not in (True, False):
            raise ValueError(f"set_default_validate_args: expected a bool, got {value!r}")
        Distribution._validate_args = value

    def __init__(self, batch_shape=(), event_shape=(), validate_args=None):
        self._batch_shape = tuple(batch_shape)
        self._event_shape = tuple(event_shape)
        if validate_args is not None:
            self._validate_args = validate_args
        if self._validate_args:
            try:
                arg_constraints = self.arg_constraints
            except NotImplementedError:
                arg_constraints = {}
                warnings.warn(f"{self.__class__} does not define `arg_constraints`. Please set "
                              "`arg_constraints = {}` or initialize the distribution with "
                              "`validate_args=False` to turn off validation.", stacklevel=2)
            for param, constraint in arg_constraints.items():
                if constraints.is_dependent(constraint):
                    continue
                if param not in self.__dict__ and isinstance(getattr(type(self), param, None),
                                                             lazy_property):
                    continue  # (the parameterization not given)
                value = getattr(self, param)
                if not _all_true(constraint.check(value)):
                    raise ValueError(
                        f"Expected parameter {param} ({type(value).__name__} of shape "
                        f"{tuple(value.shape)}) of distribution {self!r} to satisfy the "
                        f"constraint {constraint!r}, but found invalid values:\n{value}")
        super().__init__()

    def expand(self, batch_shape, _instance=None):
        """A new distribution with the parameters expanded to `batch_shape`."""
        raise NotImplementedError

    @property
    def batch_shape(self) -> tuple:
        """The shape over which parameters are batched."""
        return self._batch_shape

    @property
    def event_shape(self) -> tuple:
        """The shape of a single sample (without batching)."""
        return self._event_shape

    @property
    def arg_constraints(self) -> dict:
        """Parameter name -> the Constraint it must satisfy."""
        raise NotImplementedError

    @property
    def support(self):
        """The Constraint describing where the distribution has mass."""
        raise NotImplementedError

    @property
    def mean(self):
        """The mean."""
        raise NotImplementedError

    @property
    def mode(self):
        """The mode."""
        raise NotImplementedError(f"{self.__class__} does not implement mode")

    @property
    def variance(self):
        """The variance."""
        raise NotImplementedError

    @property
    def stddev(self):
        """The standard deviation: sqrt(variance)."""
        return _f.sqrt(self.variance)

    def sample(self, sample_shape=()):
        """A sample of shape sample_shape + batch_shape + event_shape, without gradient."""
        with no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape=()):
        """A reparameterized sample: gradients flow back to the parameters."""
        raise NotImplementedError(f"{self.__class__.__name__} has no rsample "
                                  "(has_rsample is False); use sample()")

    def sample_n(self, n: int):
        """`sample((n,))` (deprecated in PyTorch)."""
        warnings.warn("`sample_n(n)` will be deprecated. Use `sample((n,))` instead.",
                      FutureWarning, stacklevel=2)
        return self.sample((n,))

    def log_prob(self, value):
        """The log of the density or mass function at `value`."""
        raise NotImplementedError

    def cdf(self, value):
        """The cumulative distribution function at `value`."""
        raise NotImplementedError

    def icdf(self, value):
        """The inverse cumulative distribution function at `value`."""
        raise NotImplementedError

    def enumerate_support(self, expand: bool = True):
        """All values of a discrete distribution along dim 0."""
        raise NotImplementedError

    def entropy(self):
        """The entropy, of shape batch_shape."""
        raise NotImplementedError

    def perplexity(self):
        """exp(entropy())."""
        return _f.exp(self.entropy())

    def _extended_shape(self, sample_shape=()) -> tuple:
        return _sample_shape(sample_shape) + self._batch_shape + self._event_shape

    def _validate_sample(self, value) -> None:
        """Raise ValueError unless `value` is a tensor that broadcasts with batch_shape +
        event_shape and lies in the support."""
        if not isinstance(value, Tensor):
            raise ValueError("The value argument to log_prob must be a Tensor")
        start = value.ndim - len(self._event_shape)
        if value.shape[start:] != self._event_shape:
            raise ValueError(f"The right-most size of value must match event_shape: "
                             f"{value.shape} vs {self._event_shape}.")
        actual, expected = value.shape, self._batch_shape + self._event_shape
        for i, j in zip(reversed(actual), reversed(expected)):
            if i != 1 and j != 1 and i != j:
                raise ValueError(f"Value is not broadcastable with batch_shape+event_shape: "
                                 f"{actual} vs {expected}.")
        try:
            support = self.support
        except NotImplementedError:
            warnings.warn(f"{self.__class__} does not define `support` to enable sample "
                          "validation. Please initialize the distribution with "
                          "`validate_args=False` to turn off validation.", stacklevel=2)
            return
        if not _all_true(support.check(value)):
            raise ValueError(
                f"Expected value argument ({type(value).__name__} of shape "
                f"{tuple(value.shape)}) to be within the support ({support!r}) of the "
                f"distribution {self!r}, but found invalid values:\n{value}")

    def _get_checked_instance(self, cls, _instance=None):
        if _instance is None and type(self).__init__ != cls.__init__:
            raise NotImplementedError(
                f"Subclass {self.__class__.__name__} of {cls.__name__} that defines a custom "
                "__init__ method must also define a custom .expand() method.")
        return self.__new__(type(self)) if _instance is None else _instance

    def __repr__(self) -> str:
        names = [k for k in self.arg_constraints if k in self.__dict__]
        args = ", ".join(
            f"{p}: {self.__dict__[p] if self.__dict__[p].numel() == 1 else self.__dict__[p].shape}"
            for p in names)
        return f"{self.__class__.__name__}({args})"
