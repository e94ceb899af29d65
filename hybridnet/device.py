"""Devices, as PyTorch scripts name them: hybridnet computes on the CPU only.

`hn.device("cpu")` and `device=` on factories, `.to(device)`, `.cpu()` work, so
device-agnostic scripts (`device = "cuda" if hn.cuda.is_available() else "cpu"`) run
unchanged. Naming another device is allowed (PyTorch allows `torch.device("cuda")`
without CUDA too); putting a tensor there raises a clear error.
"""

import types

_KNOWN = ("cpu", "cuda", "mps", "xpu", "meta", "hip", "xla", "ipu", "hpu", "mtia", "privateuseone")


class device:  # noqa: N801  (PyTorch's name)
    """A device name: `device("cpu")`, `device("cuda:0")`, `device("cuda", 1)`."""

    __slots__ = ("type", "index")

    def __init__(self, type, index=None):  # noqa: A002  (PyTorch's argument name)
        if isinstance(type, device):
            type, index = type.type, type.index if index is None else index
        if not isinstance(type, str):
            raise TypeError(f"device: expected a string or a device, got {type!r}")
        name = type
        if ":" in name:
            name, _, num = name.partition(":")
            if index is not None or not num.isdigit():
                raise RuntimeError(f"Invalid device string: {type!r}")
            index = int(num)
        if name not in _KNOWN:
            raise RuntimeError(f"Expected one of {', '.join(_KNOWN)} device type at start of "
                               f"device string: {type!r}")
        if index is not None and int(index) < 0:
            raise RuntimeError(f"Device index must not be negative, got {index}")
        object.__setattr__(self, "type", name)
        object.__setattr__(self, "index", None if index is None else int(index))

    def __setattr__(self, name, value):
        raise AttributeError("device objects are immutable")

    def __eq__(self, other):
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and (self.type, self.index) == (other.type,
                                                                          other.index)

    def __hash__(self):
        return hash((self.type, self.index))

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self):
        index = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{index})"


CPU = device("cpu")


def check_device(where, op: str = "tensor") -> None:
    """Accept None or the CPU ('cpu', 'cpu:0', device('cpu')); raise a clear error for
    any other device (hybridnet has none)."""
    if where is None:
        return
    if isinstance(where, int) and not isinstance(where, bool):
        where = device("cuda", where)  # (PyTorch: an int names a CUDA device)
    d = where if isinstance(where, device) else device(where)
    if d.type != "cpu":
        raise RuntimeError(f"{op}: hybridnet runs on the CPU only, so device {str(d)!r} is not "
                           "available (hn.cuda.is_available() is False); use 'cpu', or pick "
                           "the device with `'cuda' if hn.cuda.is_available() else 'cpu'`")


def _false(*args, **kwargs) -> bool:
    return False


def _zero(*args, **kwargs) -> int:
    return 0


def _nothing(*args, **kwargs) -> None:
    return None


def _no_device(*args, **kwargs):
    raise RuntimeError("hybridnet has no CUDA device (hn.cuda.is_available() is False)")


cuda = types.ModuleType("hybridnet.cuda", "CUDA, as scripts probe it: never available.")
cuda.is_available = _false
cuda.device_count = _zero
cuda.is_initialized = _false
cuda.manual_seed = cuda.manual_seed_all = cuda.synchronize = cuda.empty_cache = _nothing
cuda.current_device = cuda.get_device_name = _no_device

accelerator = types.ModuleType("hybridnet.accelerator", "No accelerator: the CPU only.")
accelerator.is_available = _false
accelerator.device_count = _zero
accelerator.current_accelerator = _nothing

backends = types.ModuleType("hybridnet.backends", "Backend switches scripts set or probe.")
backends.mps = types.SimpleNamespace(is_available=_false, is_built=_false)
backends.cuda = types.SimpleNamespace(is_built=_false)
backends.cudnn = types.SimpleNamespace(enabled=False, benchmark=False, deterministic=False,
                                       is_available=_false)
