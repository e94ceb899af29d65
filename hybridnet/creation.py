"""Tensor factories and the global random generator."""

import numpy as np

from compiler import dtypes as cd

from . import dtypes as hd
from ._state import STATE, note_untraceable
from .device import check_device
from .dispatch import cast
from .shape import clone
from .tensor import Tensor, as_array, literal, make, wrap

_rng = np.random.default_rng()


def manual_seed(seed: int):
    """Seed every random draw in hybridnet (factories, init, dropout)."""
    global _rng
    note_untraceable("hn.manual_seed() inside a traced function")
    _rng = np.random.default_rng(int(seed))
    return _rng


def generator() -> np.random.Generator:
    """The global NumPy generator behind hybridnet's random draws."""
    if STATE.tracer is not None:
        note_untraceable("random numbers are drawn (rand/randn/dropout...); the JIT cannot "
                         "replay them yet")
    return _rng


def draw(recipe) -> np.ndarray:
    """The array one random recipe (kind, shape, dtype, p) draws from the global generator:
    "rand" (uniform [0, 1)), "randn" (standard normal), "dropout" (keep with probability
    1 - p, scaled by 1 / (1 - p)). A traced call draws its recipes again, in order."""
    kind, shape, dtype, p = recipe
    if kind == "dropout":
        keep = _rng.random(shape) >= p
        return (keep / (1.0 - p)).astype(dtype)
    if kind == "rand":
        return _rng.random(shape, dtype=np.float64).astype(dtype)
    if kind == "randn":
        return _rng.standard_normal(shape).astype(dtype)
    raise ValueError(f"unknown random recipe {kind!r}")


def random_tensor(kind, shape, dtype, p=0.0) -> Tensor:
    """A tensor of random values from `draw`; while a call is traced, the trace takes it
    as a runtime input drawn anew (in the same order) on every compiled call."""
    recipe = (kind, tuple(int(n) for n in shape), np.dtype(dtype), float(p))
    t = make(draw(recipe))
    if STATE.tracer is not None:
        STATE.tracer.note_random(t, recipe)
    return t


def rng_state():
    """The global generator's state (a compiled call that drew, then did not finish, puts
    it back, so that the eager rerun draws what eager draws)."""
    return _rng.bit_generator.state


def set_rng_state(state) -> None:
    """Restore a state `rng_state` returned."""
    _rng.bit_generator.state = state


def _finish(arr, requires_grad) -> Tensor:
    t = literal(arr)
    if requires_grad:
        t.requires_grad_(True)
    return t


def tensor(data, dtype=None, requires_grad=False, device=None) -> Tensor:
    """A new tensor (copying `data`): floats give float32, ints int64, bools bool."""
    check_device(device, "tensor")
    if isinstance(data, Tensor) and STATE.recorders:
        return _recorded_copy(data, dtype, requires_grad)
    arr = as_array(data, dtype)
    if dtype is not None:
        arr = arr.astype(hd.to_np(dtype), copy=False)
    return _finish(arr, requires_grad)


def _recorded_copy(data, dtype, requires_grad) -> Tensor:
    """hn.tensor(t) while recording: a copy made by recorded ops, so a traced call reads
    the tensor afresh instead of baking its values in."""
    t = clone(data.detach())
    if dtype is not None:
        t = cast(t, hd.to_np(dtype))
    if requires_grad:
        t.requires_grad_(True)
    return t


def from_numpy(a: np.ndarray) -> Tensor:
    """A tensor sharing memory with `a` (same dtype)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"from_numpy: expected an ndarray, got {type(a).__name__}")
    hd.to_np(a.dtype)
    return wrap(a)


def _shape(size) -> tuple:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = size[0]
    shape = tuple(int(s) for s in size)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {list(shape)}")
    return shape


def _dt(dtype, default=cd.DEFAULT_FLOAT) -> np.dtype:
    return default if dtype is None else hd.to_np(dtype)


def zeros(*size, dtype=None, requires_grad=False, device=None) -> Tensor:
    """Zeros of the given shape."""
    check_device(device, "zeros")
    return _finish(np.zeros(_shape(size), _dt(dtype)), requires_grad)


def ones(*size, dtype=None, requires_grad=False, device=None) -> Tensor:
    """Ones of the given shape."""
    check_device(device, "ones")
    return _finish(np.ones(_shape(size), _dt(dtype)), requires_grad)


def empty(*size, dtype=None, requires_grad=False, device=None) -> Tensor:
    """Uninitialized values of the given shape (zeros here, for reproducibility)."""
    check_device(device, "empty")
    return zeros(*size, dtype=dtype, requires_grad=requires_grad)


def full(size, fill_value, dtype=None, requires_grad=False, device=None) -> Tensor:
    """`fill_value` everywhere; the dtype follows the value when not given."""
    check_device(device, "full")
    dt = _dt(dtype, cd.scalar_dtype(fill_value))
    return _finish(np.full(_shape((size,)), fill_value, dt), requires_grad)


def zeros_like(input, dtype=None, requires_grad=False, device=None) -> Tensor:
    """Zeros shaped like `input`."""
    check_device(device, "zeros_like")
    return zeros(input.shape, dtype=dtype or input.dtype, requires_grad=requires_grad)


def ones_like(input, dtype=None, requires_grad=False, device=None) -> Tensor:
    """Ones shaped like `input`."""
    check_device(device, "ones_like")
    return ones(input.shape, dtype=dtype or input.dtype, requires_grad=requires_grad)


def full_like(input, fill_value, dtype=None, requires_grad=False, device=None) -> Tensor:
    """`fill_value` shaped like `input`."""
    check_device(device, "full_like")
    return full(input.shape, fill_value, dtype=dtype or input.dtype, requires_grad=requires_grad)


def rand(*size, dtype=None, requires_grad=False, device=None) -> Tensor:
    """Uniform [0, 1) samples."""
    check_device(device, "rand")
    t = random_tensor("rand", _shape(size), _dt(dtype))
    return t.requires_grad_(True) if requires_grad else t


def randn(*size, dtype=None, requires_grad=False, device=None) -> Tensor:
    """Standard normal samples."""
    check_device(device, "randn")
    t = random_tensor("randn", _shape(size), _dt(dtype))
    return t.requires_grad_(True) if requires_grad else t


def randint(low, high=None, size=None, dtype=None, requires_grad=False, device=None) -> Tensor:
    """Integers in [low, high) (or [0, low) when high is omitted), int64 by default."""
    check_device(device, "randint")
    if high is None:
        low, high = 0, low
    if size is None:
        raise TypeError("randint: size= (a shape tuple) is required")
    arr = generator().integers(low, high, size=_shape((size,)), dtype=np.int64)
    return _finish(arr.astype(_dt(dtype, cd.int64)), requires_grad)


def arange(start, end=None, step=1, dtype=None, requires_grad=False, device=None) -> Tensor:
    """Values from start to end (exclusive) by step; int64 if all ints, else float32."""
    check_device(device, "arange")
    if end is None:
        start, end = 0, start
    is_int = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
    dt = _dt(dtype, cd.int64 if is_int else cd.DEFAULT_FLOAT)
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    return _finish(np.arange(start, end, step).astype(dt), requires_grad)


def linspace(start, end, steps, dtype=None, requires_grad=False, device=None) -> Tensor:
    """`steps` evenly spaced values from start to end inclusive."""
    check_device(device, "linspace")
    return _finish(np.linspace(start, end, int(steps)).astype(_dt(dtype)), requires_grad)


def eye(n, m=None, dtype=None, requires_grad=False, device=None) -> Tensor:
    """Identity matrix (n x m)."""
    check_device(device, "eye")
    return _finish(np.eye(n, m, dtype=_dt(dtype)), requires_grad)


def empty_like(input, dtype=None, requires_grad=False, device=None) -> Tensor:
    """Zeros shaped like `input` (hybridnet's empty is zero-filled)."""
    check_device(device, "empty_like")
    return zeros_like(input, dtype=dtype, requires_grad=requires_grad)


def rand_like(input, dtype=None, requires_grad=False, device=None) -> Tensor:
    """Uniform [0, 1) samples shaped like `input` (its dtype by default)."""
    check_device(device, "rand_like")
    return rand(input.shape, dtype=dtype or input.dtype, requires_grad=requires_grad)


def randn_like(input, dtype=None, requires_grad=False, device=None) -> Tensor:
    """Standard normal samples shaped like `input` (its dtype by default)."""
    check_device(device, "randn_like")
    return randn(input.shape, dtype=dtype or input.dtype, requires_grad=requires_grad)


def randint_like(input, low=0, high=None, dtype=None, requires_grad=False,
                 device=None) -> Tensor:
    """Integers in [low, high) shaped like `input` (its dtype by default)."""
    check_device(device, "randint_like")
    if high is None:
        low, high = 0, low
    return randint(low, high, tuple(input.shape), dtype=dtype or input.dtype,
                   requires_grad=requires_grad)
