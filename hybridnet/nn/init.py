"""Parameter initialisers (in place, under no_grad), matching torch.nn.init."""

import math

import numpy as np

from ..autograd import no_grad
from ..creation import generator
from ..tensor import Tensor, wrap


def _set(t: Tensor, values) -> Tensor:
    with no_grad():
        t.copy_(wrap(np.asarray(values, dtype=t._data.dtype)))
    return t


def calculate_fan_in_and_fan_out(t: Tensor):
    """(fan_in, fan_out) as PyTorch computes them."""
    if t.ndim < 2:
        raise ValueError(f"fan in/out need at least 2 dims, got shape {list(t.shape)}")
    receptive = int(np.prod(t.shape[2:])) if t.ndim > 2 else 1
    return t.shape[1] * receptive, t.shape[0] * receptive


def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill with U(a, b) samples."""
    return _set(t, generator().uniform(a, b, size=t.shape))


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with N(mean, std**2) samples."""
    return _set(t, generator().normal(mean, std, size=t.shape))


def constant_(t: Tensor, val: float) -> Tensor:
    """Fill with `val`."""
    return _set(t, np.full(t.shape, val))


def zeros_(t: Tensor) -> Tensor:
    """Fill with zeros."""
    return constant_(t, 0.0)


def ones_(t: Tensor) -> Tensor:
    """Fill with ones."""
    return constant_(t, 1.0)


def _gain(nonlinearity: str, a: float = 0.0) -> float:
    if nonlinearity in ("linear", "sigmoid", "conv1d", "conv2d"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        return math.sqrt(2.0 / (1 + a * a))
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}")


def kaiming_uniform_(t: Tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu") -> Tensor:
    """He-uniform init (PyTorch's default for Linear weights uses a=sqrt(5))."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    fan = fan_in if mode == "fan_in" else fan_out
    bound = math.sqrt(3.0) * _gain(nonlinearity, a) / math.sqrt(fan) if fan else 0.0
    return uniform_(t, -bound, bound)


def xavier_uniform_(t: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot-uniform init."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(t, -bound, bound)


def xavier_normal_(t: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot-normal init."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    return normal_(t, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))
