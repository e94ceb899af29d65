"""`nn.Module` and the containers `Sequential`, `ModuleList`, `ModuleDict`."""

from collections import OrderedDict, namedtuple

import numpy as np

from compiler.errors import ShapeError

from ..autograd import no_grad
from ..device import check_device
from ..dtypes import to_np
from ..tensor import Tensor, wrap
from ..tensor_ops import parse_to
from .parameter import Parameter

IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])

# Bumped by every change to any module's attributes, children, parameters, buffers or
# training flag, so the JIT can cache a module's guard key between such changes.
STRUCTURE_VERSION = [0]


class Module:
    """Base class for layers and models: holds parameters, buffers and sub-modules.

    Subclasses assign Parameters and Modules as attributes in `__init__` and
    define `forward`; calling the module calls `forward`.
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # ---- attribute registration -----------------------------------------------------

    def _check_init(self):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() "
                                 "before assigning parameters or modules")

    def __setattr__(self, name, value):
        STRUCTURE_VERSION[0] += 1
        if isinstance(value, Parameter):
            self._check_init()
            self._drop(name)
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._check_init()
            self._drop(name)
            self._modules[name] = value
        elif "_buffers" in self.__dict__ and name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign {type(value).__name__} to buffer {name!r}")
            self._buffers[name] = value
        elif "_parameters" in self.__dict__ and name in self._parameters:
            if value is not None:  # would shadow the registered parameter (PyTorch raises too)
                raise TypeError(f"cannot assign {type(value).__name__} as parameter {name!r} "
                                "(hn.nn.Parameter or None expected)")
            self._parameters[name] = None
        elif "_modules" in self.__dict__ and name in self._modules:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} as child module "
                                f"{name!r} (hn.nn.Module or None expected)")
            self._modules[name] = None
        else:
            object.__setattr__(self, name, value)

    def _drop(self, name):
        self.__dict__.pop(name, None)
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)

    def __getattr__(self, name):
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name):
        STRUCTURE_VERSION[0] += 1
        if name in self._parameters or name in self._buffers or name in self._modules:
            self._drop(name)
        else:
            object.__delattr__(self, name)

    def register_buffer(self, name: str, tensor, persistent: bool = True):
        """Register a non-learnable tensor (saved in state_dict when persistent)."""
        STRUCTURE_VERSION[0] += 1
        self._check_init()
        self._drop(name)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def register_parameter(self, name: str, param):
        """Register a Parameter (or None) under `name`."""
        STRUCTURE_VERSION[0] += 1
        self._check_init()
        self._drop(name)
        self._parameters[name] = param

    def add_module(self, name: str, module):
        """Register a sub-module under `name`."""
        STRUCTURE_VERSION[0] += 1
        self._check_init()
        self._drop(name)
        self._modules[name] = module

    # ---- calling ------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        """Define the computation; called by `module(...)`."""
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- traversal ----------------------------------------------------------------------

    def named_modules(self, memo=None, prefix: str = ""):
        """Yield (qualified name, module) for this module and every descendant."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(memo, f"{prefix}.{name}" if prefix else name)

    def modules(self):
        """Every module in the tree, this one first."""
        return (m for _, m in self.named_modules())

    def named_children(self):
        """Yield (name, module) for direct sub-modules."""
        return ((n, m) for n, m in self._modules.items() if m is not None)

    def children(self):
        """Direct sub-modules."""
        return (m for _, m in self.named_children())

    def _named(self, table, prefix, recurse):
        seen = set()
        mods = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for mprefix, mod in mods:
            for name, value in getattr(mod, table).items():
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))
                yield (f"{mprefix}.{name}" if mprefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        """Yield (qualified name, Parameter), each parameter once."""
        return self._named("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True):
        """Every Parameter in the tree, each once."""
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix: str = "", recurse: bool = True):
        """Yield (qualified name, buffer)."""
        return self._named("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True):
        """Every buffer in the tree."""
        return (b for _, b in self.named_buffers(recurse=recurse))

    # ---- state ---------------------------------------------------------------------------

    def state_dict(self, prefix: str = "") -> OrderedDict:
        """Parameters and persistent buffers by qualified name (detached, sharing memory)."""
        out = OrderedDict()
        for mprefix, mod in self.named_modules(prefix=prefix.rstrip(".")):
            dot = f"{mprefix}." if mprefix else ""
            for name, p in mod._parameters.items():
                if p is not None:
                    out[dot + name] = p.detach()
            for name, b in mod._buffers.items():
                if b is not None and name not in mod._non_persistent:
                    out[dot + name] = b.detach()
        return out

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Copy values from `state_dict` into parameters and buffers (shapes must match)."""
        own = self.state_dict()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict for {type(self).__name__}: missing keys {missing}, "
                           f"unexpected keys {unexpected}")
        with no_grad():
            for key, target in own.items():
                if key not in state_dict:
                    continue
                src = state_dict[key]
                arr = src._data if isinstance(src, Tensor) else np.asarray(src)
                if tuple(arr.shape) != tuple(target.shape):
                    raise ShapeError(f"load_state_dict: size mismatch for {key}: checkpoint has "
                                     f"{list(arr.shape)}, the model has {list(target.shape)}")
                target.copy_(wrap(arr))
        return IncompatibleKeys(missing, unexpected)

    # ---- modes and helpers ----------------------------------------------------------------

    def train(self, mode: bool = True) -> "Module":
        """Set training mode (affects Dropout, BatchNorm) on the whole tree."""
        STRUCTURE_VERSION[0] += 1
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        """Set evaluation mode."""
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of all parameters."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                with no_grad():  # an in-place op, so a traced call replays it
                    p.grad.zero_()

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Set requires_grad on every parameter."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def to(self, *args, **kwargs) -> "Module":
        """`to(device)`, `to(dtype)`, `to(device, dtype)`, `to(tensor)`: the CPU is the only
        device; a dtype converts the floating-point parameters, their gradients and the
        floating-point buffers in place (integer buffers keep theirs, as in PyTorch)."""
        dev, dt, _ = parse_to(args, dict(kwargs))
        check_device(dev, "Module.to")
        if dt is not None:
            self._cast_floats(dt)
        return self

    def _cast_floats(self, dtype) -> None:
        dt = to_np(dtype)
        if dt.kind != "f":
            raise TypeError(f"Module.to: only floating-point dtypes are allowed, got {dtype}")
        STRUCTURE_VERSION[0] += 1
        for m in self.modules():
            for t in [*m._parameters.values(), *m._buffers.values()]:
                if t is None or t._data.dtype.kind != "f" or t._data.dtype == dt:
                    continue
                t.data = t._data.astype(dt)
                if t.grad is not None:
                    t.grad = wrap(t.grad._data.astype(dt))

    def float(self) -> "Module":
        """Floating-point parameters and buffers to float32."""
        return self.to("float32")

    def double(self) -> "Module":
        """Floating-point parameters and buffers to float64."""
        return self.to("float64")

    def half(self) -> "Module":
        """float16 is not a hybridnet dtype: raises, saying what to use."""
        raise TypeError("Module.half: float16 is not supported; use float() (float32)")

    def cpu(self) -> "Module":
        """The module itself: it is on the CPU already."""
        return self

    def cuda(self, device=None) -> "Module":
        """No CUDA here: raises, saying so."""
        return self.to("cuda")

    def type(self, dst_type) -> "Module":
        """Cast floating-point parameters and buffers to `dst_type`."""
        return self.to(dst_type)

    def apply(self, fn) -> "Module":
        """Call fn on every sub-module (children first) and on self."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def extra_repr(self) -> str:
        """Extra text for repr (override in layers)."""
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        children = list(self.named_children())
        if not children:
            return lines[0] + ")"
        for name, child in children:
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        lines.append(")")
        return "\n".join(lines)


class Sequential(Module):
    """Modules applied in order: `Sequential(Linear(2, 3), ReLU())`."""

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (dict, OrderedDict)):
            for name, mod in modules[0].items():
                self.add_module(name, mod)
        else:
            for i, mod in enumerate(modules):
                self.add_module(str(i), mod)

    def forward(self, input):
        for mod in self._modules.values():
            input = mod(input)
        return input

    def __getitem__(self, index):
        if isinstance(index, slice):  # keeps the original names, as PyTorch does
            return Sequential(OrderedDict(list(self._modules.items())[index]))
        return list(self._modules.values())[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module) -> "Sequential":
        """Add a module at the end."""
        self.add_module(str(len(self._modules)), module)
        return self


class ModuleList(Module):
    """A list of modules, registered so their parameters are found."""

    def __init__(self, modules=None):
        super().__init__()
        for mod in modules or []:
            self.append(mod)

    def append(self, module) -> "ModuleList":
        """Add a module at the end."""
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules) -> "ModuleList":
        """Add several modules."""
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module) -> None:
        """Insert a module before `index`."""
        STRUCTURE_VERSION[0] += 1
        mods = list(self._modules.values())
        mods.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def __getitem__(self, index):
        mods = list(self._modules.values())
        return ModuleList(mods[index]) if isinstance(index, slice) else mods[index]

    def __setitem__(self, index: int, module):
        STRUCTURE_VERSION[0] += 1
        key = list(self._modules)[index]
        self._modules[key] = module

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleDict(Module):
    """A dict of modules, registered so their parameters are found."""

    def __init__(self, modules=None):
        super().__init__()
        for name, mod in (modules or {}).items():
            self.add_module(name, mod)

    def __getitem__(self, key: str):
        return self._modules[key]

    def __setitem__(self, key: str, module):
        self.add_module(key, module)

    def __delitem__(self, key: str):
        STRUCTURE_VERSION[0] += 1
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key) -> bool:
        return key in self._modules

    def keys(self):
        """Module names."""
        return self._modules.keys()

    def values(self):
        """Modules."""
        return self._modules.values()

    def items(self):
        """(name, module) pairs."""
        return self._modules.items()
