"""`hn.save` / `hn.load_state`: state dicts as NumPy .npz archives, never pickle; what
`hn.load` reads (`Source`, `load_options`: export_load.load dispatches on the content);
`hn.set_num_threads` / `hn.get_num_threads`. docs/serialization.md.

Tensors become named arrays (their key path, like 'state/0/exp_avg'); the
nesting (dicts, lists, numbers, strings) is kept as JSON in a uint8 array named
'__hybridnet__'. Files are written to a temporary file and renamed, so a crash
never leaves a half-written archive; loading uses allow_pickle=False and checks
every array.
"""

import io
import json
import os
import tempfile
import warnings
import zipfile

import numpy as np

from compiler.errors import ExportError

from . import torch_pt
from .device import check_device
from .nn.module import Module
from .optim.optimizer import Optimizer
from .serialize_errors import SerializationError
from .tensor import Tensor, wrap

_META = "__hybridnet__"
_FORMAT = 1
_RESERVED = (_META, "file", "args", "allow_pickle", "kwds")


def _encode(obj, path, arrays):
    if isinstance(obj, Tensor):
        obj = obj.detach()._data
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise SerializationError(f"save: array at {path or '<root>'} has dtype {obj.dtype}; "
                                     "only numeric arrays can be saved")
        key = base = path or "value"
        # Unique, and never one of np.savez's own argument names or the metadata's name.
        while key in arrays or key in _RESERVED:
            key = f"{base}~{len(arrays)}"
        arrays[key] = obj
        return {"t": "array", "k": key}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise SerializationError(f"save: dict key {k!r} at {path} must be str or int")
            items.append([k, _encode(v, f"{path}/{k}" if path else str(k), arrays)])
        return {"t": "dict", "items": items}
    if isinstance(obj, (list, tuple)):
        vals = [_encode(v, f"{path}/{i}" if path else str(i), arrays) for i, v in enumerate(obj)]
        return {"t": "list" if isinstance(obj, list) else "tuple", "items": vals}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return {"t": "value", "v": obj}
    if isinstance(obj, np.generic):
        return {"t": "value", "v": obj.item()}
    where = path or "<root>"
    if callable(getattr(obj, "state_dict", None)):
        kind = _kind_of(obj)
        raise SerializationError(
            f"save: cannot store a whole {type(obj).__name__} ({kind}) at {where}: hybridnet "
            "files hold tensors, numbers, strings, lists and dicts, never pickled objects. "
            f"Save its state instead: hn.save({kind}.state_dict(), path), and restore it with "
            f"{kind}.load_state_dict(hn.load(path)) after building the {kind} in code")
    raise SerializationError(f"save: cannot store {type(obj).__name__} at {where}; only "
                             "tensors, arrays, numbers, strings, lists and dicts (for a model "
                             "or an optimizer, save its state_dict())")


def _kind_of(obj) -> str:
    if isinstance(obj, Module):
        return "model"
    return "optimizer" if isinstance(obj, Optimizer) else "object"


def _umask() -> int:
    """The process umask, read without changing it where the OS allows."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save(obj, f, pickle_module=None, pickle_protocol=None,
         _use_new_zipfile_serialization=True, _disable_byteorder_record=False) -> None:
    """torch.save's counterpart: write a state dict (nested dicts/lists/tuples of tensors,
    arrays, numbers, strings) to `f`, a path (written atomically: a temporary file, then a
    rename) or a binary file object. Never pickle: the pickle arguments are ignored. A
    whole nn.Module or optimizer is refused: save its `state_dict()`."""
    arrays = {}
    tree = _encode(obj, "", arrays)
    meta = json.dumps({"format": _FORMAT, "tree": tree}).encode()
    arrays[_META] = np.frombuffer(meta, dtype=np.uint8)
    if hasattr(f, "write"):
        if isinstance(f, io.TextIOBase):
            raise TypeError("hn.save: f is a text file; open it in binary mode ('wb')")
        np.savez(f, **arrays)
        return
    path = _fspath(f, "save")
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".hn-save-", suffix=".npz", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            np.savez(out, **arrays)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp made it 0600; give the mode open() would
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _fspath(f, op) -> str:
    try:
        return os.fspath(f)
    except TypeError:
        raise TypeError(f"hn.{op}: f must be a path (str or os.PathLike) or a binary file "
                        f"object, got {type(f).__name__}") from None


def _decode(node, arrays, path):
    if not isinstance(node, dict) or "t" not in node:
        raise SerializationError(f"{path}: malformed structure entry {node!r:.80}")
    kind = node["t"]
    if kind == "array":
        key = node.get("k")
        if key not in arrays:
            raise SerializationError(f"{path}: missing array {key!r}")
        return wrap(arrays[key])
    if kind == "dict":
        return {k: _decode(v, arrays, path) for k, v in node["items"]}
    if kind in ("list", "tuple"):
        vals = [_decode(v, arrays, path) for v in node["items"]]
        return vals if kind == "list" else tuple(vals)
    if kind == "value":
        return node["v"]
    raise SerializationError(f"{path}: unknown structure kind {kind!r}")


def _read_arrays(f, label) -> dict:
    try:
        loaded = np.load(f, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded as archive:
                arrays = {name: archive[name] for name in archive.files}
    except FileNotFoundError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise SerializationError(f"load_state: {label} is not a valid .npz archive "
                                 f"(damaged, truncated or not an npz file): {exc}") from exc
    if not isinstance(loaded, np.lib.npyio.NpzFile):  # a bare .npy array
        raise SerializationError(f"load_state: {label} holds a single .npy array, not a .npz "
                                 "archive")
    for name, arr in arrays.items():
        if arr.dtype.kind not in "biuf":
            raise SerializationError(f"load_state: array {name!r} in {label} has non-numeric "
                                     f"dtype {arr.dtype}")
    return arrays


def load_state(f):
    """Read a file written by `hn.save` (or any numeric .npz) back into tensors; `f` is a
    path or a binary file object (read from its current position)."""
    if hasattr(f, "read"):
        return _load_state(_seekable(f), _label(f))
    path = _fspath(f, "load_state")
    return _load_state(path, path)


def _load_state(f, label):
    arrays = _read_arrays(f, label)
    raw = arrays.pop(_META, None)
    if raw is None:
        return {name: wrap(arr) for name, arr in arrays.items()}
    try:
        meta = json.loads(raw.astype(np.uint8).tobytes().decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SerializationError(f"load_state: {label} has a damaged structure record") from exc
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise SerializationError(f"load_state: {label} has unsupported format "
                                 f"{meta.get('format') if isinstance(meta, dict) else meta!r}; "
                                 f"this hybridnet reads format {_FORMAT}")
    try:
        return _decode(meta["tree"], arrays, label)
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        if isinstance(exc, SerializationError):
            raise
        raise SerializationError(f"load_state: {label} has a malformed structure: {exc}") from exc


def _label(f) -> str:
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else f"<{type(f).__name__}>"


def _seekable(f):
    """`f` itself when it can seek (zip and npz readers need to), else its bytes."""
    if isinstance(f, io.TextIOBase):
        raise TypeError("hn.load: f is a text file; open it in binary mode ('rb')")
    try:
        if f.seekable():
            return f
    except (AttributeError, OSError, ValueError):
        pass
    return io.BytesIO(f.read())


# ---- what hn.load reads (hybridnet/export_load.py dispatches on it) -------------------


class CannotRead(ExportError, OSError):
    """hn.load could not read the file: an OSError, and an ExportError as hn.load of a
    graph file raised before it read other formats."""


class FileNotFound(CannotRead, FileNotFoundError):
    """hn.load of a missing file (a FileNotFoundError, as torch.load raises)."""


class Source:
    """The file hn.load reads: `file` (binary, seekable, at its start), `label` (for
    messages) and `folder` (where a graph file's sidecar is; None for a stream)."""

    def __init__(self, f):
        self._own = not hasattr(f, "read")
        if self._own:
            path = _fspath(f, "load")
            try:
                self.file = open(path, "rb")  # noqa: SIM115  (closed by close())
            except OSError as exc:
                kind = FileNotFound if isinstance(exc, FileNotFoundError) else CannotRead
                raise kind(f"load: cannot read {path!r}: {exc.strerror}") from None
            self.label, self.folder = path, os.path.dirname(os.path.abspath(path))
        else:
            self.file, self.label = _seekable(f), _label(f)
            self.folder = os.path.dirname(os.path.abspath(self.label)) if \
                isinstance(getattr(f, "name", None), str) else None
        self.start = self.file.tell()
        self.zip = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.zip is not None:
            self.zip.close()  # (does not close the file it was given)
        if self._own:
            self.file.close()

    def rest(self) -> bytes:
        self.file.seek(self.start)
        return self.file.read()

    def kind(self) -> str:
        """"graph" (an exported JSON graph), "npz" (hn.save / NumPy) or "torch" (a
        torch.save zip), from the content; SerializationError for anything else."""
        head = self.file.read(64)
        self.file.seek(self.start)
        if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
            return self._zip_kind()
        if head.startswith(b"\x93NUMPY"):
            return "npz"  # (a bare .npy: load_state says what it is)
        if head.lstrip(b" \t\r\n\xef\xbb\xbf").startswith(b"{"):
            return "graph"
        if head[:1] == b"\x80":
            raise SerializationError(
                f"load: {self.label} is a plain pickle: a PyTorch file in the legacy format "
                "(torch.save before PyTorch 1.6, or _use_new_zipfile_serialization=False) or "
                "pickled Python objects. hybridnet reads the zip format torch.save writes by "
                "default: in PyTorch, torch.save(torch.load(path), new_path)")
        what = "an empty file" if not head else f"unknown content (starts {head[:12]!r})"
        raise SerializationError(
            f"load: {self.label} is {what}; hn.load reads files written by hn.save, "
            "torch.save (.pt/.pth) and hn.export (JSON graphs)")

    def _zip_kind(self) -> str:
        try:
            self.zip = zipfile.ZipFile(self.file)
            names = self.zip.namelist()
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise SerializationError(f"load: {self.label} is a damaged or truncated zip "
                                     f"archive: {exc}") from None
        if names and all(n.endswith(".npy") for n in names):
            return "npz"
        if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
            raise SerializationError(
                f"load: {self.label} is a TorchScript archive (torch.jit.save): hybridnet "
                "runs no TorchScript. In PyTorch, torch.save(model.state_dict(), path), then "
                "model.load_state_dict(hn.load(path)) into the same hybridnet model")
        if any(n.count("/") == 1 and n.endswith("/data.pkl") for n in names):
            return "torch"
        raise SerializationError(f"load: {self.label} is a zip archive of neither hn.save "
                                 "(.npz) nor torch.save (no <name>/data.pkl)")

    def load(self, kind, encoding):
        """The content of a "npz" or "torch" file."""
        if kind == "npz":
            self.file.seek(self.start)
            return _load_state(self.file, self.label)
        return torch_pt.read(self.zip, self.label, encoding)


_ENCODINGS = ("utf-8", "utf8", "ascii", "latin1", "latin-1", "bytes")


_WARNED = []  # (weights_only=False's warning: once per process)


def load_options(map_location, pickle_module, weights_only, mmap, extra) -> str:
    """Check torch.load's options; returns the pickle `encoding` to read with."""
    if weights_only is False and not _WARNED:
        _WARNED.append(True)
        warnings.warn(
            "load(weights_only=False): hybridnet never executes pickled code; the file is "
            "read as weights_only=True reads it (tensors, state dicts, numbers, strings, "
            "lists, tuples, dicts), and anything else in it is refused", stacklevel=3)
    if pickle_module is not None:
        raise SerializationError("load: pickle_module is not supported: hybridnet reads "
                                 "pickles with its own restricted reader")
    if mmap not in (None, False, True):
        raise TypeError(f"load: mmap must be a bool, got {mmap!r}")
    encoding = extra.pop("encoding", "utf-8")
    if extra:
        raise TypeError(f"load: unexpected arguments {', '.join(sorted(extra))}")
    if encoding not in _ENCODINGS:
        raise SerializationError(f"load: encoding {encoding!r}; use one of {_ENCODINGS}")
    _check_location(map_location)
    return encoding


def _check_location(where) -> None:
    """map_location: everything loads to the CPU, the only device; naming another one
    raises as a tensor put there would. A function is accepted and not called."""
    if where is None or callable(where) and not isinstance(where, (str, type)):
        return
    if isinstance(where, dict):
        for value in where.values():
            check_device(str(value), "load(map_location)")
        return
    if not isinstance(where, str) and hasattr(where, "type"):  # (a torch.device too)
        where = str(where)
    check_device(where, "load(map_location)")
