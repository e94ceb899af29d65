"""Reading PyTorch .pt/.pth files without PyTorch and without running pickled code.

`read(zf, label)` returns what `torch.load(f, weights_only=True)` returns for the zip
torch.save writes (PyTorch 1.6 on): `<name>/data.pkl` (the pickled object; each storage a
persistent id `('storage', storage_type, key, location, numel)`), `<name>/data/<key>` (the
storages' bytes), `<name>/byteorder` (little when absent), with hybridnet tensors.

`_Reader` subclasses the pure-Python `pickle._Unpickler` (what `pickle.Unpickler` is
without its C accelerator, whose BUILD and APPEND act on any object) with an opcode table
of data opcodes plus checked GLOBAL (`find_class`: a fixed allowlist of markers, nothing
imported), REDUCE (markers only), BUILD (OrderedDict attributes only), NEWOBJ
(OrderedDict only), APPEND/SETITEM (real lists and dicts only) and storage persistent ids
(`persistent_load`); anything else raises SerializationError naming what was refused.
Tensors are copied out of their storages (`as_strided`, then a copy) after size, stride,
offset and record sizes are checked; dtypes hybridnet lacks are widened (float16 ->
float32...) with a warning, or refused. docs/serialization.md has the details.
"""

import _compat_pickle
import io
import math
import pickle
import pickletools
import reprlib
import warnings
from collections import OrderedDict

import numpy as np

from .device import device
from .dtypes import BY_NP, DType
from .nn.parameter import Parameter
from .serialize_errors import SerializationError
from .tensor import Tensor, wrap

PICKLE_LIMIT = 256 << 20  # bytes of data.pkl read at most (a state dict's is ~100 B a tensor)
EXPAND_LIMIT = 1 << 24  # elements a file's tensors may have beyond their storages' (views)
_REPR = reprlib.Repr()
for _name in ("maxlist", "maxtuple", "maxdict", "maxset", "maxfrozenset", "maxdeque",
              "maxarray"):
    setattr(_REPR, _name, 4)
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 40, 40, 40


def _short(value, limit: int) -> str:
    """A bounded repr for error messages (a crafted file's value may hold one object
    many times over: its full repr could take gigabytes)."""
    return _REPR.repr(value)[:limit]
MAX_DIMS = 32

# torch dtype name -> (raw little-endian NumPy dtype in the file, NumPy dtype loaded as)
_DTYPES = {
    "float32": ("<f4", "float32"), "float64": ("<f8", "float64"), "int64": ("<i8", "int64"),
    "int32": ("<i4", "int32"), "bool": ("|b1", "bool"), "float16": ("<f2", "float32"),
    "bfloat16": ("<u2", "float32"), "int16": ("<i2", "int32"), "int8": ("|i1", "int32"),
    "uint8": ("|u1", "int32"), "uint16": ("<u2", "int32"), "uint32": ("<u4", "int64"),
}
_SAME = {d.name: d for d in BY_NP.values()}
_ALIASES = {"float": "float32", "double": "float64", "long": "int64", "int": "int32",
            "half": "float16", "short": "int16"}
_STORAGES = {"FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
             "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
             "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
             "BoolStorage": "bool"}
_NO_DTYPE = ("complex", "float8", "qint", "quint", "uint64", "bits", "int1", "int2", "int3",
             "int4", "int5", "int6", "int7", "uint1", "uint2", "uint3", "uint4", "uint5",
             "uint6", "uint7", "cfloat", "cdouble", "chalf")


def _refuse(what) -> SerializationError:
    return SerializationError(f"{what}; hybridnet reads tensors, numbers, strings, bytes, "
                              "lists, tuples, sets and dicts from PyTorch files (what "
                              "torch.load(weights_only=True) accepts) and executes nothing")


class _Marker:
    """What an allowed GLOBAL pushes: a name, and for callables the function REDUCE runs."""

    __slots__ = ("name", "call", "dtype")

    def __init__(self, name, call=None, dtype=None):
        self.name, self.call, self.dtype = name, call, dtype

    def __repr__(self):
        return self.name


class _Storage:
    """One storage record, read (once) when a tensor first needs it."""

    __slots__ = ("archive", "key", "dtype", "nbytes", "_raw")

    def __init__(self, archive, key, dtype, nbytes):
        self.archive, self.key, self.dtype, self.nbytes = archive, key, dtype, nbytes
        self._raw = None

    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = self.archive.record_bytes(f"data/{self.key}", self.nbytes)
        return self._raw


def _dtype_marker(name):
    if name in _SAME:
        return _SAME[name]  # (the hn dtype itself)
    if name in _DTYPES:
        return _Marker(f"torch.{name}", dtype=name)
    if name.startswith(_NO_DTYPE):
        raise _refuse(f"torch.{name}: hybridnet has no {name} dtype")
    return None


def _check_ints(value, what, low=0):
    if not isinstance(value, (tuple, list)) or len(value) > MAX_DIMS or not all(
            type(v) is int and v >= low for v in value):
        raise SerializationError(f"{what} must be a tuple of at most {MAX_DIMS} integers "
                                 f">= {low}, got {_short(value, 80)}")
    return tuple(value)


class _Reader(pickle._Unpickler):
    """The restricted unpickler of data.pkl (see the module docstring)."""

    def __init__(self, file, archive, encoding="utf-8"):
        super().__init__(file, encoding=encoding)
        self.archive = archive
        self.storages = {}
        self.expanded = 0  # elements the file's tensors hold beyond their storages

    # ---- the two hooks pickle.Unpickler offers ------------------------------------------

    def find_class(self, module, name):
        if self.proto < 3 and (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif self.proto < 3 and module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        marker = _GLOBALS.get(f"{module}.{name}")
        if marker is None and module == "torch":
            marker = _dtype_marker(_ALIASES.get(name, name))
            if marker is None and name in _STORAGES:
                marker = _Marker(f"torch.{name}", dtype=_STORAGES[name])
            elif marker is None and name.endswith("Storage") and name != "TypedStorage":
                raise _refuse(f"{self.archive.label}: torch.{name}: hybridnet has no dtype "
                              "for these tensors")
        if marker is None and name[:1].isupper():  # (a class: torch.save(model), say)
            raise _refuse(f"{self.archive.label}: refused the global {module}.{name}, a "
                          "pickled Python object (torch.save(model) pickles the whole "
                          "model: in PyTorch, save model.state_dict() and load that)")
        if marker is None:
            raise _refuse(f"{self.archive.label}: refused the global {module}.{name}")
        return marker

    def persistent_load(self, pid):
        if type(pid) is not tuple or len(pid) != 5 or pid[0] not in ("storage", b"storage"):
            raise _refuse(f"{self.archive.label}: refused the persistent id {_short(pid, 80)}")
        _, kind, key, _location, numel = pid  # (the location: everything loads to the CPU)
        if not isinstance(kind, _Marker) or kind.dtype is None and kind.name != "UntypedStorage":
            raise SerializationError(f"{self.archive.label}: a storage of type {_short(kind, 60)}")
        if type(key) is not str or type(numel) is not int or numel < 0:
            raise SerializationError(f"{self.archive.label}: a malformed storage id "
                                     f"{_short(pid, 80)}")
        nbytes = numel * (np.dtype(_DTYPES[kind.dtype][0]).itemsize if kind.dtype else 1)
        found = self.storages.get(key)
        if found is None:
            self.archive.check(f"data/{key}", nbytes)  # (exists, holds nbytes: before reading)
            found = self.storages[key] = _Storage(self.archive, key, kind.dtype, nbytes)
        elif found.dtype != kind.dtype or found.nbytes != nbytes:
            raise SerializationError(f"{self.archive.label}: storage {key!r} is declared "
                                     "twice, differently")
        return found

    # ---- the opcodes that act on objects, restricted -----------------------------------

    def _reduce(self):
        args = self.stack.pop()
        func = self.stack[-1]
        if not isinstance(func, _Marker) or func.call is None:
            raise _refuse(f"{self.archive.label}: refused to call {_short(func, 60)}")
        if type(args) is not tuple:
            raise SerializationError(f"{self.archive.label}: {func.name} called with "
                                     f"{type(args).__name__} arguments")
        try:
            self.stack[-1] = func.call(self, *args)
        except TypeError as exc:
            raise SerializationError(f"{self.archive.label}: {func.name}{_short(args, 100)}: "
                                     f"{exc}") from None

    def _build(self):
        state = self.stack.pop()
        inst = self.stack[-1]
        if type(inst) is not OrderedDict or not isinstance(state, dict) or not all(
                type(k) is str and not hasattr(OrderedDict, k) for k in state):
            what = inst.name if isinstance(inst, _Marker) else type(inst).__name__
            raise _refuse(f"{self.archive.label}: refused to set the state of {what} to "
                          f"{_short(state, 60)}")
        inst.__dict__.update(state)  # (state_dict()'s _metadata)

    def _newobj(self):
        args = self.stack.pop()
        cls = self.stack.pop()
        if cls is not _GLOBALS["collections.OrderedDict"] or type(args) is not tuple or args:
            raise _refuse(f"{self.archive.label}: refused to create a {_short(cls, 60)}")
        self.append(OrderedDict())

    def _target(self, kinds, op):
        obj = self.stack[-1]
        if type(obj) not in kinds:
            raise _refuse(f"{self.archive.label}: refused {op} on a {type(obj).__name__}")
        return obj

    def _append(self):
        value = self.stack.pop()
        self._target((list,), "APPEND").append(value)

    def _appends(self):
        items = self.pop_mark()
        self._target((list,), "APPENDS").extend(items)

    def _setitem(self):
        value = self.stack.pop()
        key = self.stack.pop()
        self._target((dict, OrderedDict), "SETITEM")[key] = value

    def _setitems(self):
        items = self.pop_mark()
        target = self._target((dict, OrderedDict), "SETITEMS")
        for i in range(0, len(items) - 1, 2):
            target[items[i]] = items[i + 1]

    def _additems(self):
        items = self.pop_mark()
        self._target((set,), "ADDITEMS").update(items)


# ---- what REDUCE may call -------------------------------------------------------------


def _tensor(reader, storage, offset, size, stride, requires_grad, dtype=None) -> Tensor:
    """The tensor `size`/`stride` (elements) at `offset` in `storage`, copied."""
    label = reader.archive.label
    if not isinstance(storage, _Storage):
        raise SerializationError(f"{label}: a tensor's storage is {_short(storage, 60)}")
    name = dtype or storage.dtype
    if name is None:
        raise SerializationError(f"{label}: a tensor on an untyped storage without a dtype")
    raw_dtype = np.dtype(_DTYPES[name][0]).newbyteorder(reader.archive.byteorder)
    size = _check_ints(size, f"{label}: a tensor's size")
    stride = _check_ints(stride, f"{label}: a tensor's stride")
    if type(offset) is not int or offset < 0 or len(stride) != len(size):
        raise SerializationError(f"{label}: tensor offset {_short(offset, 40)} / stride "
                                 f"{stride} do not fit size {size}")
    available = storage.nbytes // raw_dtype.itemsize
    numel = math.prod(size)
    if numel and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= available:
        raise SerializationError(f"{label}: a tensor of size {list(size)}, stride "
                                 f"{list(stride)}, offset {offset} reaches past its storage "
                                 f"{storage.key!r} of {available} elements")
    extra = max(0, numel - available)
    reader.expanded += extra
    if numel > max(available, EXPAND_LIMIT) or reader.expanded > EXPAND_LIMIT:
        raise SerializationError(f"{label}: a tensor of {numel} elements views a storage of "
                                 f"{available} (an expanded view), or the file's expanded "
                                 f"views add up to more than {EXPAND_LIMIT} elements; "
                                 "hybridnet copies tensors on load: save t.contiguous() "
                                 "instead")
    if numel == 0:
        data = np.zeros(size, raw_dtype)
    else:
        flat = np.frombuffer(storage.raw(), raw_dtype, count=available)
        data = np.lib.stride_tricks.as_strided(
            flat[offset:], size, [s * raw_dtype.itemsize for s in stride], writeable=False)
    out = _convert(data, name, reader.archive)
    t = wrap(out)
    if requires_grad is True and out.dtype.kind == "f":
        t.requires_grad_(True)
    return t


def _convert(data, name, archive) -> np.ndarray:
    """A C-contiguous copy of `data` in native byte order and a hybridnet dtype."""
    want = np.dtype(_DTYPES[name][1])
    if want.name != name:
        archive.converted.add(f"{name} -> {want.name}")
    if name == "bfloat16":  # (the upper half of a float32's bits)
        return (np.ascontiguousarray(data, dtype=np.uint32) << 16).view(np.float32)
    if name == "bool":
        return np.ascontiguousarray(data.view(np.uint8) != 0)
    return np.array(data, dtype=want, order="C")


def _rebuild_tensor_v2(reader, storage, offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
    """torch._utils._rebuild_tensor_v2 (hooks and metadata are not kept, as in torch's
    own state dicts, where they are empty)."""
    return _tensor(reader, storage, offset, size, stride, requires_grad)


def _rebuild_tensor(reader, storage, offset, size, stride):
    return _tensor(reader, storage, offset, size, stride, False)


def _rebuild_tensor_v3(reader, storage, offset, size, stride, requires_grad, backward_hooks,
                       dtype, metadata=None):
    name = dtype.name if isinstance(dtype, DType) else getattr(dtype, "dtype", None)
    if not isinstance(dtype, (DType, _Marker)) or name not in _DTYPES:
        raise SerializationError(f"{reader.archive.label}: a tensor of dtype {_short(dtype, 40)}")
    if not isinstance(storage, _Storage) or storage.dtype is not None:
        raise SerializationError(f"{reader.archive.label}: _rebuild_tensor_v3 of "
                                 f"{_short(storage, 40)}, not an untyped storage")
    return _tensor(reader, storage, offset, size, stride, requires_grad, name)


def _parameter(reader, data, requires_grad=True, backward_hooks=None, state=None):
    if not isinstance(data, Tensor) or type(requires_grad) is not bool:
        raise SerializationError(f"{reader.archive.label}: a Parameter of {_short(data, 40)}")
    if not _empty(state):
        raise _refuse(f"{reader.archive.label}: a Parameter with Python attributes "
                      f"{_short(state, 80)}")
    return Parameter(data, requires_grad and data.dtype.is_floating_point)


def _from_type_v2(reader, func, new_type, args, state):
    if not isinstance(func, _Marker) or func.name not in _REBUILDS or \
            not (new_type is _TENSOR or new_type is _PARAMETER) or type(args) is not tuple:
        raise _refuse(f"{reader.archive.label}: refused _rebuild_from_type_v2 of "
                      f"{_short(new_type, 40)}")
    if not _empty(state):
        raise _refuse(f"{reader.archive.label}: a tensor with Python attributes "
                      f"{_short(state, 80)}")
    t = func.call(reader, *args)
    return _parameter(reader, t, t.requires_grad) if new_type is _PARAMETER else t


def _empty(state) -> bool:
    """No Python attributes: None, {}, or a tuple of those (dict and slot state)."""
    return state is None or type(state) in (dict, OrderedDict) and not state or \
        type(state) is tuple and all(_empty(s) for s in state)


def _size(reader, dims=()):
    return _check_ints(dims, f"{reader.archive.label}: torch.Size")


def _device(reader, kind, index=None):
    if type(kind) is not str or (index is not None and type(index) is not int):
        raise SerializationError(f"{reader.archive.label}: torch.device{_short((kind, index), 60)}")
    return device(kind, index)


def _encode(reader, text, encoding="utf-8"):
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise _refuse(f"{reader.archive.label}: refused _codecs.encode"
                      f"{_short((text, encoding), 60)}")
    return text.encode("latin1")


def _builtin(kind, types):
    def make(reader, *args):
        if not all(type(a) in types for a in args) or len(args) > 2:
            raise _refuse(f"{reader.archive.label}: refused {kind.__name__}{_short(args, 60)}")
        return kind(*args)
    return make


def _ordered_dict(reader, items=()):
    if type(items) not in (list, tuple):
        raise _refuse(f"{reader.archive.label}: refused OrderedDict({_short(items, 60)})")
    return OrderedDict(items)


_TENSOR = _Marker("torch.Tensor")
_PARAMETER = _Marker("torch.nn.parameter.Parameter")
_REBUILDS = ("torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor",
             "torch._utils._rebuild_tensor_v3")
_GLOBALS = {
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v3": _rebuild_tensor_v3,
    "torch._utils._rebuild_parameter": _parameter,
    "torch._utils._rebuild_parameter_with_state": _parameter,
    "torch._tensor._rebuild_from_type_v2": _from_type_v2,
    "collections.OrderedDict": _ordered_dict,
    "torch.Size": _size,
    "torch.device": _device,
    "_codecs.encode": _encode,
    "builtins.set": _builtin(set, (list, tuple)),
    "builtins.frozenset": _builtin(frozenset, (list, tuple)),
    "builtins.bytearray": _builtin(bytearray, (bytes,)),
    "builtins.complex": _builtin(complex, (int, float)),
}
_GLOBALS = {name: _Marker(name, call) for name, call in _GLOBALS.items()}
_GLOBALS["torch.Tensor"] = _TENSOR
_GLOBALS["torch.nn.parameter.Parameter"] = _PARAMETER
_GLOBALS["torch.storage.UntypedStorage"] = _Marker("UntypedStorage")

_DATA_OPS = ("PROTO FRAME STOP NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2 LONG LONG1 "
             "LONG4 FLOAT BINFLOAT STRING BINSTRING SHORT_BINSTRING BINBYTES SHORT_BINBYTES "
             "BINBYTES8 UNICODE BINUNICODE SHORT_BINUNICODE BINUNICODE8 EMPTY_TUPLE TUPLE "
             "TUPLE1 TUPLE2 TUPLE3 EMPTY_LIST LIST EMPTY_DICT DICT EMPTY_SET FROZENSET MARK "
             "POP POP_MARK DUP GET BINGET LONG_BINGET PUT BINPUT LONG_BINPUT MEMOIZE GLOBAL "
             "STACK_GLOBAL PERSID BINPERSID").split()
_CHECKED = {"REDUCE": _Reader._reduce, "BUILD": _Reader._build, "NEWOBJ": _Reader._newobj,
            "APPEND": _Reader._append, "APPENDS": _Reader._appends,
            "SETITEM": _Reader._setitem, "SETITEMS": _Reader._setitems,
            "ADDITEMS": _Reader._additems}


def _refused_opcode(code):
    names = {op.code.encode("latin1")[0]: op.name for op in pickletools.opcodes}
    what = f"the pickle opcode {names[code]}" if code in names else f"the byte {code:#04x}"

    def refuse(self):
        raise _refuse(f"{self.archive.label}: refused {what}")
    return refuse


_Reader.dispatch = {code: _refused_opcode(code) for code in range(256)}
_Reader.dispatch.update({getattr(pickle, op)[0]: pickle._Unpickler.dispatch[getattr(pickle, op)[0]]
                         for op in _DATA_OPS})
_Reader.dispatch.update({getattr(pickle, op)[0]: fn for op, fn in _CHECKED.items()})


# ---- the archive ----------------------------------------------------------------------


class _Archive:
    """The records of one torch.save zip: names checked, sizes checked before reading."""

    def __init__(self, zf, label):
        self.zf, self.label = zf, label
        self.converted = set()
        infos = zf.infolist()
        names = [i.filename for i in infos]
        if not names:
            raise SerializationError(f"{label}: an empty archive")
        if len(set(names)) != len(names):
            raise SerializationError(f"{label}: the archive names a record twice")
        for name in names:
            parts = name.split("/")
            if name.startswith("/") or "\\" in name or ".." in parts or len(parts) < 2 or \
                    parts[0] != names[0].split("/")[0] or ":" in parts[0]:
                raise SerializationError(f"{label}: refused the archive record name "
                                         f"{name[:80]!r} (torch.save writes <name>/...)")
        self.prefix = names[0].split("/")[0] + "/"
        self.infos = {i.filename[len(self.prefix):]: i for i in infos}
        order = self._small("byteorder", b"little").strip()
        if order not in (b"little", b"big"):
            raise SerializationError(f"{label}: unknown byte order {order[:20]!r}")
        self.byteorder = "<" if order == b"little" else ">"

    def _small(self, name, default):
        info = self.infos.get(name)
        return default if info is None else self.record_bytes(name, None, 64)

    def check(self, name, nbytes, limit=None):
        """The ZipInfo of record `name`, which holds exactly `nbytes` (or at most `limit`)
        bytes by the archive's directory."""
        info = self.infos.get(name)
        if info is None:
            raise SerializationError(f"{self.label}: the archive has no record {name!r} "
                                     "(truncated or damaged)")
        if nbytes is not None and info.file_size != nbytes:
            raise SerializationError(f"{self.label}: record {name!r} holds {info.file_size} "
                                     f"bytes, its tensors need {nbytes} (damaged or "
                                     "truncated)")
        if limit is not None and info.file_size > limit:
            raise SerializationError(f"{self.label}: record {name!r} declares "
                                     f"{info.file_size} bytes, more than the {limit} read")
        return info

    def record_bytes(self, name, nbytes, limit=None) -> bytes:
        """The bytes of record `name` (`check`ed first)."""
        info = self.check(name, nbytes, limit)
        want = info.file_size
        try:
            with self.zf.open(info) as f:
                data = f.read(want)  # (bounded: a compressed record cannot expand further)
        except Exception as exc:  # noqa: BLE001  (zipfile raises many kinds)
            raise SerializationError(f"{self.label}: cannot read record {name!r}: "
                                     f"{type(exc).__name__}: {exc}") from None
        if len(data) != want:
            raise SerializationError(f"{self.label}: record {name!r} is truncated ("
                                     f"{len(data)} of {want} bytes)")
        return data


def read(zf, label, encoding="utf-8"):
    """What torch.load(weights_only=True) returns for the torch.save zip `zf`
    (a zipfile.ZipFile), with hybridnet tensors. Raises SerializationError."""
    archive = _Archive(zf, label)
    data = archive.record_bytes("data.pkl", None, PICKLE_LIMIT)
    reader = _Reader(io.BytesIO(data), archive, encoding)
    try:
        result = reader.load()
    except SerializationError:
        raise
    except Exception as exc:  # noqa: BLE001  (whatever a damaged pickle trips over)
        raise SerializationError(f"{label}: data.pkl is damaged ({type(exc).__name__}: "
                                 f"{str(exc)[:120]})") from None
    _check_result(result, label)
    if archive.converted:
        warnings.warn(f"hn.load({label}): hybridnet has no such dtypes, so tensors were "
                      f"converted: {', '.join(sorted(archive.converted))}", stacklevel=3)
    return result


def _check_result(result, label):
    """Refuse internal objects left in the result (a bare storage, an uncalled global)."""
    seen, todo = set(), [result]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif isinstance(obj, _Storage):
            raise _refuse(f"{label}: holds a bare storage, not a tensor")
        elif isinstance(obj, _Marker):
            raise _refuse(f"{label}: holds {obj.name} as a value (hybridnet has no such "
                          "object)")
