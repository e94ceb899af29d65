"""`hn.save` / `hn.load_state`: state dicts as NumPy .npz archives, never pickle.

Tensors become named arrays (their key path, like 'state/0/exp_avg'); the
nesting (dicts, lists, numbers, strings) is kept as JSON in a uint8 array named
'__hybridnet__'. Files are written to a temporary file and renamed, so a crash
never leaves a half-written archive; loading uses allow_pickle=False and checks
every array.
"""

import json
import os
import tempfile
import zipfile

import numpy as np

from .tensor import Tensor, wrap

_META = "__hybridnet__"
_FORMAT = 1
_RESERVED = (_META, "file", "args", "allow_pickle", "kwds")


class SerializationError(ValueError):
    """A file could not be saved or loaded as a hybridnet state archive."""


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
    raise SerializationError(f"save: cannot store {type(obj).__name__} at {path or '<root>'}; "
                             "only tensors, arrays, numbers, strings, lists and dicts")


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


def save(obj, path) -> None:
    """Write a state dict (nested dicts/lists of tensors and numbers) to `path` atomically."""
    arrays = {}
    tree = _encode(obj, "", arrays)
    meta = json.dumps({"format": _FORMAT, "tree": tree}).encode()
    arrays[_META] = np.frombuffer(meta, dtype=np.uint8)
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".hn-save-", suffix=".npz", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp made it 0600; give the mode open() would
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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


def _read_arrays(path) -> dict:
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded as archive:
                arrays = {name: archive[name] for name in archive.files}
    except FileNotFoundError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise SerializationError(f"load_state: {path} is not a valid .npz archive "
                                 f"(damaged, truncated or not an npz file): {exc}") from exc
    if not isinstance(loaded, np.lib.npyio.NpzFile):  # a bare .npy array
        raise SerializationError(f"load_state: {path} holds a single .npy array, not a .npz "
                                 "archive")
    for name, arr in arrays.items():
        if arr.dtype.kind not in "biuf":
            raise SerializationError(f"load_state: array {name!r} in {path} has non-numeric "
                                     f"dtype {arr.dtype}")
    return arrays


def load_state(path):
    """Read a file written by `hn.save` (or any numeric .npz) back into tensors."""
    path = os.fspath(path)
    arrays = _read_arrays(path)
    raw = arrays.pop(_META, None)
    if raw is None:
        return {name: wrap(arr) for name, arr in arrays.items()}
    try:
        meta = json.loads(raw.astype(np.uint8).tobytes().decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SerializationError(f"load_state: {path} has a damaged structure record") from exc
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise SerializationError(f"load_state: {path} has unsupported format "
                                 f"{meta.get('format') if isinstance(meta, dict) else meta!r}; "
                                 f"this hybridnet reads format {_FORMAT}")
    try:
        return _decode(meta["tree"], arrays, path)
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        if isinstance(exc, SerializationError):
            raise
        raise SerializationError(f"load_state: {path} has a malformed structure: {exc}") from exc
