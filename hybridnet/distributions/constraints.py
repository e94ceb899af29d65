"""Constraints: the regions parameters and samples must lie in (torch.distributions.constraints).

`check(value)` returns a bool tensor computed with hybridnet ops, so a check made inside a
traced function becomes a value guard rather than a read of the data.
"""

from .. import functional as _f
from ..tensor import Tensor

__all__ = [
    "Constraint", "boolean", "dependent", "dependent_property", "greater_than",
    "greater_than_eq", "independent", "integer_interval", "interval", "is_dependent",
    "nonnegative", "positive", "real", "real_vector", "simplex", "unit_interval",
]


def _all_last(valid: Tensor, ndims: int) -> Tensor:
    """True where every entry of the last `ndims` dims of bool `valid` is True."""
    if ndims == 0:
        return valid
    dims = tuple(range(valid.ndim - ndims, valid.ndim))
    return _f.sum(~valid, dims) == 0


class Constraint:
    """A region over which a variable is valid.

    is_discrete: whether the region is discrete; event_dim: how many rightmost dims
    together make one event (`check` reduces them away).
    """

    is_discrete = False
    event_dim = 0

    def check(self, value):
        """A bool tensor of shape sample_shape + batch_shape: does each event satisfy this?"""
        raise NotImplementedError

    def __repr__(self):
        return self.__class__.__name__[1:] + "()"


class _Dependent(Constraint):
    """Placeholder for variables whose support depends on other variables (not checkable)."""

    def __init__(self, *, is_discrete=NotImplemented, event_dim=NotImplemented):
        self._is_discrete = is_discrete
        self._event_dim = event_dim

    @property
    def is_discrete(self):  # noqa: D102
        if self._is_discrete is NotImplemented:
            raise NotImplementedError(".is_discrete cannot be determined statically")
        return self._is_discrete

    @property
    def event_dim(self):  # noqa: D102
        if self._event_dim is NotImplemented:
            raise NotImplementedError(".event_dim cannot be determined statically")
        return self._event_dim

    def __call__(self, *, is_discrete=NotImplemented, event_dim=NotImplemented):
        if is_discrete is NotImplemented:
            is_discrete = self._is_discrete
        if event_dim is NotImplemented:
            event_dim = self._event_dim
        return _Dependent(is_discrete=is_discrete, event_dim=event_dim)

    def check(self, x):
        """Always raises: a dependent constraint cannot be checked."""
        raise ValueError("Cannot determine validity of dependent constraint")


def is_dependent(constraint) -> bool:
    """Whether `constraint` is a dependent (uncheckable) constraint."""
    return isinstance(constraint, _Dependent)


class _DependentProperty(property, _Dependent):
    """A property on instances that reads as a dependent constraint on the class
    (`@constraints.dependent_property(is_discrete=True, event_dim=0)`)."""

    def __init__(self, fn=None, *, is_discrete=NotImplemented, event_dim=NotImplemented):
        property.__init__(self, fn)
        self._is_discrete = is_discrete
        self._event_dim = event_dim

    def __call__(self, fn):
        return _DependentProperty(fn, is_discrete=self._is_discrete, event_dim=self._event_dim)


class _IndependentConstraint(Constraint):
    """`base_constraint` with `reinterpreted_batch_ndims` more dims folded into each event."""

    def __init__(self, base_constraint, reinterpreted_batch_ndims):
        if not isinstance(base_constraint, Constraint):
            raise TypeError(f"independent: base_constraint must be a Constraint, got "
                            f"{type(base_constraint).__name__}")
        if not isinstance(reinterpreted_batch_ndims, int) or reinterpreted_batch_ndims < 0:
            raise ValueError(f"independent: reinterpreted_batch_ndims must be an int >= 0, "
                             f"got {reinterpreted_batch_ndims!r}")
        self.base_constraint = base_constraint
        self.reinterpreted_batch_ndims = reinterpreted_batch_ndims

    @property
    def is_discrete(self):  # noqa: D102
        return self.base_constraint.is_discrete

    @property
    def event_dim(self):  # noqa: D102
        return self.base_constraint.event_dim + self.reinterpreted_batch_ndims

    def check(self, value):
        """The base check, all-reduced over the reinterpreted dims."""
        result = self.base_constraint.check(value)
        if result.ndim < self.reinterpreted_batch_ndims:
            raise ValueError(f"Expected value.dim() >= {self.event_dim} but got {value.ndim}")
        return _all_last(result, self.reinterpreted_batch_ndims)

    def __repr__(self):
        return (f"{self.__class__.__name__[1:]}({self.base_constraint!r}, "
                f"{self.reinterpreted_batch_ndims})")


class _Boolean(Constraint):
    """The two values {0, 1}."""

    is_discrete = True

    def check(self, value):
        """value == 0 or value == 1."""
        return (value == 0) | (value == 1)


class _IntegerInterval(Constraint):
    """Integers in [lower_bound, upper_bound]."""

    is_discrete = True

    def __init__(self, lower_bound, upper_bound):
        self.lower_bound = lower_bound
        self.upper_bound = upper_bound

    def check(self, value):
        """Inside the bounds and (for float values) integral."""
        inside = (value >= self.lower_bound) & (value <= self.upper_bound)
        if value._data.dtype.kind == "f":
            safe = _f.where(inside, value, 0.0)  # no NaN or inf reaches the integer cast
            inside = inside & (safe == safe.long().to(value.dtype))
        return inside

    def __repr__(self):
        return (f"{self.__class__.__name__[1:]}(lower_bound={self.lower_bound}, "
                f"upper_bound={self.upper_bound})")


class _Real(Constraint):
    """The extended real line [-inf, inf] (NaN excluded)."""

    def check(self, value):
        """value == value (False for NaN)."""
        return value == value


class _GreaterThan(Constraint):
    """The half line (lower_bound, inf]."""

    def __init__(self, lower_bound):
        self.lower_bound = lower_bound

    def check(self, value):
        """lower_bound < value."""
        return value > self.lower_bound

    def __repr__(self):
        return f"{self.__class__.__name__[1:]}(lower_bound={self.lower_bound})"


class _GreaterThanEq(_GreaterThan):
    """The half line [lower_bound, inf]."""

    def check(self, value):
        """lower_bound <= value."""
        return value >= self.lower_bound


class _Interval(Constraint):
    """The closed interval [lower_bound, upper_bound]."""

    def __init__(self, lower_bound, upper_bound):
        self.lower_bound = lower_bound
        self.upper_bound = upper_bound

    def check(self, value):
        """lower_bound <= value <= upper_bound."""
        return (value >= self.lower_bound) & (value <= self.upper_bound)

    def __repr__(self):
        return (f"{self.__class__.__name__[1:]}(lower_bound={self.lower_bound}, "
                f"upper_bound={self.upper_bound})")


class _Simplex(Constraint):
    """The unit simplex over the last dim: x >= 0 and x.sum(-1) == 1 (to 1e-6)."""

    event_dim = 1

    def check(self, value):
        """All entries non-negative and the row sums within 1e-6 of 1."""
        return _all_last(value >= 0, 1) & (_f.abs(_f.sum(value, -1) - 1) < 1e-6)


dependent = _Dependent()
dependent_property = _DependentProperty
independent = _IndependentConstraint
boolean = _Boolean()
integer_interval = _IntegerInterval
real = _Real()
real_vector = independent(real, 1)
positive = _GreaterThan(0.0)
nonnegative = _GreaterThanEq(0.0)
greater_than = _GreaterThan
greater_than_eq = _GreaterThanEq
unit_interval = _Interval(0.0, 1.0)
interval = _Interval
simplex = _Simplex()

