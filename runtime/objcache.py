"""The llvm backend's object-code cache on disk: a new process loads machine code instead
of compiling it.

An entry is one file `o_<key>.bin` under `<HYBRIDNET_CACHE_DIR>/objects/` (default
~/.cache/hybridnet; HYBRIDNET_CACHE=0 turns every disk cache off). The key hashes what
the code depends on: the IR text, the hybridnet, llvmlite and LLVM versions, and the
target CPU with its features. The file holds a magic line, the full key, the length and
the SHA-256 of the payload, then the object code; anything that does not check out
(truncated, damaged, another key's entry, another format) is logged, removed and
rebuilt, never loaded. Writers write a temporary file and rename it over the entry, so
concurrent processes never see half a file. The folder is bounded
(HYBRIDNET_CACHE_MAX_MB, default 256): past it, the least recently used entries (by
modification time, refreshed on every hit) are evicted.
"""

import hashlib
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
        folder = os.path.dirname(path)
        try:
            fd, tmp = tempfile.mkstemp(prefix=".o-", suffix=".tmp", dir=folder)
            with os.fdopen(fd, "wb") as f:
                f.write(_pack(key, payload))
            os.replace(tmp, path)
        except OSError as exc:
            LOG.warning("hybridnet cache: cannot write %s (%s)", path, exc)
            return False
        self.evict()
        return True

    def evict(self, limit=None):
        """Remove least recently used entries until the folder holds at most `limit`
        bytes (default HYBRIDNET_CACHE_MAX_MB); returns how many were removed."""
        limit = _max_bytes() if limit is None else limit
        folder = self.folder
        if folder is None:
            return 0
        entries = []
        for name in os.listdir(folder):
            if name.startswith("o_") and name.endswith(".bin"):
                try:
                    st = os.stat(os.path.join(folder, name))
                except OSError:
                    continue
                entries.append((st.st_mtime, st.st_size, name))
        total, removed = sum(e[1] for e in entries), 0
        for _, size, name in sorted(entries):
            if total <= limit:
                break
            _remove(os.path.join(folder, name))
            total -= size
            removed += 1
        return removed


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
