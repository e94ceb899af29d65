"""The llvm backend's machine-code cache on disk: a new process loads compiled code
instead of compiling it.

Entries live under `<HYBRIDNET_CACHE_DIR>/objects/` (default ~/.cache/hybridnet;
HYBRIDNET_CACHE=0 turns every disk cache off), named by a key that hashes what the code
depends on (runtime.llvm_engine.graph_key: the graph's structure, the lowering code, the
llvmlite version, the CPU and its features). Two kinds:
- a shared library `l_<key>.so` with `l_<key>.json` (the full key, the library's length
  and SHA-256, and the kernel's calling convention): loaded with ctypes, no LLVM at all;
- an object file `o_<key>.bin` (magic line, full key, length, SHA-256, object code),
  loaded into LLVM's MCJIT, where no linker was found to make a library.
Anything that does not check out (truncated, damaged, another key's entry, another
format) is logged, removed and rebuilt, never loaded. Writers write a temporary file and
rename it over the entry (the library before its record), so concurrent processes never
see half an entry. The folder is bounded (HYBRIDNET_CACHE_MAX_MB, default 256): past it,
the least recently used entries (by modification time, refreshed on every hit) go.
"""

import hashlib
import json
import logging
import os
import tempfile

LOG = logging.getLogger("hybridnet.cache")
MAGIC = b"HNOBJ1\n"
DEFAULT_MAX_MB = 256


def cache_root():
    """The disk cache folder, or None when HYBRIDNET_CACHE=0."""
    if os.environ.get("HYBRIDNET_CACHE", "1") == "0":
        return None
    return os.environ.get("HYBRIDNET_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "hybridnet")


def subdir(name):
    """`<cache root>/<name>`, created; None when disabled or not writable."""
    base = cache_root()
    if base is None:
        return None
    path = os.path.join(base, name)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None
    return path if os.access(path, os.W_OK) else None


def _max_bytes() -> int:
    raw = os.environ.get("HYBRIDNET_CACHE_MAX_MB", "")
    try:
        return int(float(raw) * 2 ** 20) if raw else DEFAULT_MAX_MB * 2 ** 20
    except ValueError:
        return DEFAULT_MAX_MB * 2 ** 20


def key_of(*parts) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


class ObjectCache:
    """get(key) -> bytes or None; put(key, payload). Failures are logged, never raised."""

    def __init__(self, folder=None):
        self._folder = folder

    @property
    def folder(self):
        return self._folder or subdir("objects")

    def _path(self, key):
        folder = self.folder
        return None if folder is None else os.path.join(folder, f"o_{key[:40]}.bin")

    def get(self, key):
        path = self._path(key)
        if path is None or not os.path.exists(path):
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            LOG.warning("hybridnet cache: cannot read %s (%s); compiling instead", path, exc)
            return None
        payload = _unpack(data, key)
        if payload is None:
            LOG.warning("hybridnet cache: discarded damaged or foreign entry %s; rebuilding",
                        path)
            _remove(path)
            return None
        try:
            os.utime(path)  # (least recently used = oldest modification time)
        except OSError:
            pass
        return payload

    def put(self, key, payload: bytes) -> bool:
        path = self._path(key)
        if path is None:
            return False
        ok = _write(path, _pack(key, payload))
        self.evict(keep=os.path.basename(path)[:-4])
        return ok

    # -- shared libraries ---------------------------------------------------------------

    def _lib_paths(self, key):
        folder = self.folder
        if folder is None:
            return None, None
        stem = os.path.join(folder, f"l_{key[:40]}")
        return stem + ".so", stem + ".json"

    def get_library(self, key):
        """(record, path of the checked library) or None."""
        lib, rec = self._lib_paths(key)
        if rec is None or not os.path.exists(rec):
            return None
        try:
            with open(rec, "rb") as f:
                record = json.loads(f.read().decode())
            with open(lib, "rb") as f:
                data = f.read()
            ok = (record.get("key") == key and record.get("size") == len(data) and
                  record.get("sha256") == hashlib.sha256(data).hexdigest() and
                  record.get("meta_sha256") == _digest(record.get("meta")))
        except (OSError, ValueError, UnicodeDecodeError, AttributeError):
            ok = False
        if not ok:
            LOG.warning("hybridnet cache: discarded damaged or foreign entry %s; rebuilding",
                        rec)
            _remove(rec)
            _remove(lib)
            return None
        try:
            os.utime(rec)
        except OSError:
            pass
        return record, lib

    def discard_library(self, key, why):
        """Remove a library entry that failed to load (logged)."""
        lib, rec = self._lib_paths(key)
        if rec is not None:
            LOG.warning("hybridnet cache: discarded %s (%s); rebuilding", rec, why)
            _remove(rec)
            _remove(lib)

    def put_library(self, key, data: bytes, meta: dict):
        """Store a library and its record; returns the library's path (None if not
        stored)."""
        lib, rec = self._lib_paths(key)
        if lib is None:
            return None
        record = {"key": key, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                  "meta": meta, "meta_sha256": _digest(meta)}
        if not (_write(lib, data) and _write(rec, json.dumps(record).encode())):
            return None
        self.evict(keep=os.path.basename(rec)[:-5])
        return lib

    def evict(self, limit=None, keep=None):
        """Remove least recently used entries until the folder holds at most `limit`
        bytes (default HYBRIDNET_CACHE_MAX_MB), never the entry `keep` (the one just
        written, which its writer is about to load); returns how many were removed."""
        limit = _max_bytes() if limit is None else limit
        folder = self.folder
        if folder is None:
            return 0
        entries = {}  # stem -> [mtime of its record or object, total bytes, files]
        for name in os.listdir(folder):
            stem, ext = os.path.splitext(name)
            if not (name.startswith(("o_", "l_")) and ext in (".bin", ".so", ".json")):
                continue
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            entry = entries.setdefault(stem, [0.0, 0, []])
            if ext != ".so":
                entry[0] = st.st_mtime
            entry[1] += st.st_size
            entry[2].append(name)
        total, removed = sum(e[1] for e in entries.values()), 0
        for stem, (_, size, names) in sorted(entries.items(), key=lambda e: e[1]):
            if total <= limit:
                break
            if stem == keep:
                continue
            for name in names:
                _remove(os.path.join(folder, name))
            total -= size
            removed += 1
        return removed


def _write(path, data) -> bool:
    """Write then rename (no reader sees half a file); False (logged) on failure."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".o-", suffix=".tmp", dir=os.path.dirname(path))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError as exc:
        LOG.warning("hybridnet cache: cannot write %s (%s)", path, exc)
        if tmp is not None:
            _remove(tmp)
        return False


def _digest(meta) -> str:
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


def _pack(key, payload) -> bytes:
    head = f"{key}\n{len(payload)}\n{hashlib.sha256(payload).hexdigest()}\n".encode()
    return MAGIC + head + payload


def _unpack(data, key):
    if not data.startswith(MAGIC):
        return None
    rest = data[len(MAGIC):]
    parts = rest.split(b"\n", 3)
    if len(parts) != 4:
        return None
    stored, length, digest, payload = parts
    try:
        ok = (stored.decode() == key and int(length) == len(payload) and
              hashlib.sha256(payload).hexdigest() == digest.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    return payload if ok else None


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


OBJECTS = ObjectCache()
