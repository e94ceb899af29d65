"""`hn.export` and `hn.load`: traced graphs out of Python and back.

    text = hn.export(model, x)                       # JSON: the graph, weights, guards
    hn.export(model, x, path="m.json")               # written atomically
    onnx_bytes = hn.export(model, x, format="onnx")  # runs in onnxruntime
    f = hn.load("m.json"); f(x)                      # compiled, no Python code needed

Export runs the function once on the example arguments, eagerly, while the JIT
records it (as torch.onnx.export runs the model). The graph is the path that call took:
each value the code branched on is a guard, checked by the loaded function, which
raises `ExportError` naming the guard when an input would take another path.
docs/export.md has the format.
"""

import hashlib
import io
import os
import stat
import tempfile
import zipfile

import numpy as np

from compiler.errors import ExportError, LoweringError
from compiler.export import graph_file
from compiler.export.onnx_export import to_onnx
from compiler.passes.fusion import partition
from runtime.executor import SIDE_EXIT, Outcome, guard_holds

from . import serialize
from .jit.build import Source, TraceGraph
from .jit.capture_graph import capture
from .jit.compile import compile_trace
from .jit.traced import default_backend
from .tensor import Tensor, wrap

FORMATS = ("json", "onnx", "dot", "llvm")


def export(fn_or_module, *example_args, path=None, format="json"):  # noqa: A002
    """The graph `fn_or_module(*example_args)` records, as `format`: "json" (str; the
    project's format, weights included), "onnx" (bytes), "dot" (str; the optimized graph
    with its fusion groups as clusters) or "llvm" (str; the LLVM IR of its compiled
    kernels). Writes `path` too when given (atomically; JSON weights above 1 MiB then go
    to a sidecar `<path>.weights.npz`)."""
    if format not in FORMATS:
        raise ExportError(f"export: unknown format {format!r}; choose one of "
                          f"{', '.join(FORMATS)}")
    exported, _ = capture(fn_or_module, example_args)
    if format == "json":
        return _json(exported, path)
    if format == "onnx":
        out = to_onnx(exported)
    elif format == "dot":
        out = _dot(exported)
    else:
        out = _llvm_ir(exported)
    if path is not None:
        _write(path, out.encode("utf-8") if isinstance(out, str) else out)
    return out


def _json(exported, path):
    side = {}

    def place(arrays):
        data = _npz_bytes(arrays)
        digest = hashlib.sha256(data).hexdigest()
        side["name"] = f"{os.path.basename(os.fspath(path))}.{digest[:12]}.weights.npz"
        side["data"] = data
        return side["name"], digest
    try:
        data = graph_file.dumps(exported, None if path is None else place)
    except ValueError as exc:
        raise ExportError(f"export {exported.name}: {exc}") from None
    if path is not None:
        folder = os.path.dirname(os.path.abspath(os.fspath(path)))
        if side:  # (named by its content: the JSON file names the very weights it needs)
            _write(os.path.join(folder, side["name"]), side["data"])
        _write(path, data)
        _remove_stale_sidecars(path, side.get("name"))
    return data.decode("utf-8")


def _remove_stale_sidecars(path, keep):
    base = os.path.basename(os.fspath(path)) + "."
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    for name in os.listdir(folder):
        if name.startswith(base) and name.endswith(".weights.npz") and name != keep:
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


def _compiled(exported, backend=None):
    """compile_trace's result for an exported graph (the JIT's pipeline and caches)."""
    n = exported.n_results
    sources = [Source("arg", i) if i < exported.n_args else Source("captured")
               for i in range(len(exported.graph.inputs))]
    tg = TraceGraph(exported.graph, sources, [("out", k) for k in range(n)], exported.guards, [],
                    n, fresh=[True] * n)
    return compile_trace(tg, False, backend or default_backend())


def _dot(exported) -> str:
    try:
        optimized = _compiled(exported).optimized
    except LoweringError as exc:
        raise ExportError(f"export {exported.name}: format='dot': {exc}") from None
    groups = {id(node): unit.index for unit in partition(optimized) for node in unit.nodes
              if len(unit.nodes) > 1}
    return optimized.to_dot(groups)


def _llvm_ir(exported) -> str:
    try:
        res = _compiled(exported, "llvm")
    except LoweringError as exc:
        raise ExportError(f"export {exported.name}: format='llvm': {exc}") from None
    if res.backend != "llvm":
        raise ExportError(f"export {exported.name}: format='llvm': the llvm backend could "
                          f"not compile this graph ({res.fallback})")
    return res.kernel.llvm_ir


# ---- files --------------------------------------------------------------------------------


def _write(path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename: never half-written."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".hn-export-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _npz_bytes(arrays) -> bytes:
    """An .npz archive with fixed timestamps (the same weights give the same bytes)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, arrays[name], allow_pickle=False)
            z.writestr(zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0)),
                       member.getvalue())
    return buf.getvalue()


def _sidecar_reader(folder):
    def read(name, digest):
        return _Sidecar(folder, name, digest)
    return read


class _Sidecar:
    """The weights archive next to a graph file: a regular file in the same folder whose
    SHA-256 is the one the graph file names; each array's header is checked against its
    declaration before its bytes are read (no pickle)."""

    def __init__(self, folder, name, digest):
        if os.path.basename(name) != name or not name.endswith(".npz"):
            raise ExportError(f"the sidecar {name[:60]!r} must be a .npz file next to the "
                              "graph file")
        path = os.path.join(folder, name)
        try:
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode):
                raise ExportError(f"the sidecar {name!r} is not a regular file")
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ExportError(f"cannot read the sidecar {name!r}: {exc.strerror}") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise ExportError(f"the sidecar {name!r} is not the one the graph file was "
                              "written with (its SHA-256 differs)")
        try:
            self.zip = zipfile.ZipFile(io.BytesIO(data))
        except zipfile.BadZipFile as exc:
            raise ExportError(f"the sidecar {name!r} is not an .npz archive: {exc}") from None
        self.name = name

    def get(self, weight, shape, dtype):
        try:
            with self.zip.open(weight + ".npy") as f:
                version = np.lib.format.read_magic(f)
                reader = {(1, 0): np.lib.format.read_array_header_1_0,
                          (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                if reader is None:
                    raise ValueError(f"unsupported .npy format version {version}")
                have_shape, fortran, have_dtype = reader(f, max_header_size=10000)
                if tuple(have_shape) != tuple(shape) or fortran or \
                        np.dtype(have_dtype) != dtype.newbyteorder("<"):
                    raise ExportError(f"the sidecar's {weight!r} is {have_dtype}"
                                      f"{list(have_shape)}, the graph declares "
                                      f"{dtype}{list(shape)}")
                want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                raw = f.read(want)
        except KeyError:
            raise ExportError(f"the sidecar {self.name!r} has no array {weight!r}") from None
        except (ValueError, OSError, zipfile.BadZipFile) as exc:
            raise ExportError(f"the sidecar's {weight!r} cannot be read: {exc}") from None
        if len(raw) != want:
            raise ExportError(f"the sidecar's {weight!r} holds {len(raw)} bytes, not {want}")
        return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None,
         backend=None, **pickle_load_args):
    """torch.load's counterpart, deciding by the file's content (not its name): a file of
    `hn.save` gives what `hn.load_state` returns; a PyTorch .pt/.pth file (torch.save's zip
    format) what `torch.load(f, weights_only=True)` returns, with hybridnet tensors; a JSON
    graph (`hn.export(..., format="json")`) a LoadedFunction, compiled by the JIT's
    pipeline (kernel caches included; `backend` picks the compiler). `f`: a path or a
    binary file object. Everything loads to the CPU (`map_location` may name only the
    CPU; a function is accepted and not called); `mmap` is accepted and ignored.
    `weights_only=False` warns and reads the file the same way: nothing in it is ever
    executed. docs/serialization.md.
    """
    encoding = serialize.load_options(map_location, pickle_module, weights_only, mmap,
                                      pickle_load_args)
    with serialize.Source(f) as source:
        kind = source.kind()
        if kind != "graph":
            return source.load(kind, encoding)
        sidecar = None if source.folder is None else _sidecar_reader(source.folder)
        exported = graph_file.loads(source.rest(), sidecar)
    return LoadedFunction(exported, backend)


def loads(data, backend=None) -> "LoadedFunction":
    """`load` from the JSON text or bytes themselves (weights must be inline)."""
    return LoadedFunction(graph_file.loads(data), backend)


class LoadedFunction:
    """An exported graph, compiled: call it with tensors (or NumPy arrays) shaped like the
    example arguments; returns hn tensors in the structure the function returned.
    `exported`: the ExportedGraph (its `graph`, names, weights and guards)."""

    def __init__(self, exported, backend=None):
        self.exported = exported
        self._weights = exported.weight_arrays()
        self._exit = ("?", "?", "?")  # (kind, value at export, value now) of a failed guard
        try:
            self._result = _compiled(exported, backend)
            self.backend = self._result.backend
        except LoweringError as exc:  # (size-0 dims: the JIT runs those eagerly too)
            self._result, self.backend = None, f"interpreter ({exc})"

    @property
    def graph(self):
        """The graph as loaded (before optimization)."""
        return self.exported.graph

    def __call__(self, *args):
        ex = self.exported
        arrays = self._arguments(args) + self._weights
        out = self._run(arrays)
        if isinstance(out, Outcome):
            raise ExportError(self._guard_message())
        leaves = iter(wrap(np.asarray(a)) for a in out[:ex.n_results])
        return _rebuild(ex.result_spec, leaves)

    def _run(self, arrays):
        """The outputs, or SIDE_EXIT when a value guard fails as eager computes it: a guard
        that fails in compiled code is checked again by the reference interpreter, which
        computes as eager does (compiled code may sum in another order, and a float read
        with .item() is compared bit for bit)."""
        if self._result is not None:
            out = self._result.executable.run(arrays)
            if not isinstance(out, Outcome):
                return out
        ex = self.exported
        outs = ex.graph.run(*arrays)
        for index, kind, expected in ex.guards:
            if not guard_holds(outs[index], kind, expected):
                self._exit = (kind, expected, np.asarray(outs[index]).reshape(-1)[0].item())
                return SIDE_EXIT
        return outs

    def _arguments(self, args) -> list:
        ex = self.exported
        leaves = []
        want = len(ex.args_spec["items"])
        if len(args) != want:
            raise ExportError(f"{ex.name}: takes {want} positional arguments, got {len(args)}")
        _match(ex.args_spec, tuple(args), "the arguments", leaves, ex.name)
        if len(leaves) != ex.n_args:
            raise ExportError(f"{ex.name}: takes {ex.n_args} tensors, got {len(leaves)}")
        arrays = []
        for value, node, name in zip(leaves, ex.arg_inputs, ex.input_names):
            arr = value._data if isinstance(value, Tensor) else value
            if not isinstance(arr, np.ndarray):
                raise ExportError(f"{ex.name}: input {name!r} must be a tensor or a NumPy "
                                  f"array, got {type(value).__name__}")
            if tuple(arr.shape) != tuple(node.shape) or arr.dtype != node.dtype:
                raise ExportError(f"{ex.name}: input {name!r} is {arr.dtype}"
                                  f"{list(arr.shape)}; the graph was exported for "
                                  f"{node.type_str()}")
            arrays.append(np.ascontiguousarray(arr))
        return arrays

    def _guard_message(self) -> str:
        ex = self.exported
        exit_ = self._exit  # (set by the interpreter's check in _run)
        held = ", ".join(f"{ex.output_names[i]} ({kind}) == {value!r}"
                         for i, kind, value in ex.guards) or "no value guard"
        what = "branched on" if exit_[0] == "bool" else "read as a Python number"
        return (f"{ex.name}: these inputs take a path the exported graph does not hold: a "
                f"value the code {what} was {exit_[1]!r} at export and is {exit_[2]!r} "
                f"now (the graph holds when {held}); export again with inputs that take "
                "this path")

    def __repr__(self) -> str:
        ex = self.exported
        ins = ", ".join(f"{n}: {i.type_str()}" for n, i in zip(ex.input_names, ex.arg_inputs))
        return f"<hn.load {ex.name}({ins}) backend={self.backend}>"


def _match(spec, value, where, leaves, name):
    t = spec["t"]
    if t == "tensor":
        leaves.append(value)
        return
    if t == "const":
        if value != spec["value"] or type(value) is not type(spec["value"]):
            raise ExportError(f"{name}: {where} was {spec['value']!r} at export, got "
                              f"{value!r} (export again for other values)")
        return
    kind = {"tuple": (tuple, list), "list": (tuple, list), "dict": (dict,)}[t]
    if not isinstance(value, kind) or len(value) != len(spec["items"]):
        raise ExportError(f"{name}: {where} must be a {t} of {len(spec['items'])} items "
                          f"like the example's, got {type(value).__name__}")
    if t == "dict":
        if list(value) != spec["keys"]:
            raise ExportError(f"{name}: {where} must have keys {spec['keys']}")
        value = [value[k] for k in spec["keys"]]
    for k, (s, v) in enumerate(zip(spec["items"], value)):
        _match(s, v, f"{where}[{k}]", leaves, name)


def _rebuild(spec, leaves):
    t = spec["t"]
    if t == "tensor":
        return next(leaves)
    if t == "const":
        return spec["value"]
    items = [_rebuild(s, leaves) for s in spec["items"]]
    if t == "dict":
        return dict(zip(spec["keys"], items))
    return items if t == "list" else tuple(items)


__all__ = ["export", "load", "loads", "LoadedFunction", "ExportError"]
