"""The project's JSON graph format (schema version 1; docs/export.md is its reference).

`dumps(exported)` gives deterministic bytes (sorted keys, fixed separators, weights as
base64 of little-endian bytes); weights above `SIDECAR_BYTES` in total may go to a
sidecar `.npz` instead (`dumps(..., sidecar=place)`: `place(arrays)` stores them and
names the file and its SHA-256). `loads(data, sidecar)` validates every field before it
builds anything: op names are looked up in the registry, every shape and dtype is
checked against the op's rule, declared sizes against the bytes actually present, and
nothing from the file is ever executed (no pickle, no eval, no import by name).
"""

import base64
import binascii
import json
import math

import numpy as np

from ..errors import ExportError, OpError
from ..ir import Graph, Node
from ..registry import REGISTRY, Trait
from .exported import ExportedGraph

FORMAT = "hybridnet.graph"
VERSION = 1
SIDECAR_BYTES = 1 << 20  # weights above this total go to a sidecar .npz when asked
MAX_ELEMENTS = 1 << 31  # no declared tensor may have more elements
MAX_RANK = 32
DTYPES = ("bool", "int32", "int64", "float32", "float64")


# ---- writing ------------------------------------------------------------------------------


def dumps(exported: ExportedGraph, sidecar=None, producer="hybridnet") -> bytes:
    """The JSON bytes. With `sidecar` (a function of {weight name: array} returning the
    sidecar's (file name relative to the JSON file, SHA-256 hex)), weights go there when
    they total more than SIDECAR_BYTES."""
    graph = exported.graph
    names = _value_names(exported)
    arrays = exported.weight_arrays()
    weight_names = exported.input_names[exported.n_args:]
    place = None
    if sidecar is not None and sum(a.nbytes for a in arrays) > SIDECAR_BYTES:
        file, digest = sidecar(dict(zip(weight_names, arrays)))
        place = {"sidecar": file, "sha256": digest}
    inputs = []
    for k, (node, name) in enumerate(zip(graph.inputs, exported.input_names)):
        entry = {"name": name, "kind": "arg" if k < exported.n_args else "weight",
                 "shape": list(node.shape), "dtype": str(node.dtype)}
        if k >= exported.n_args:
            entry["data"] = dict(place) if place else _array_data(arrays[k - exported.n_args])
        inputs.append(entry)
    nodes = [_node_entry(n, names) for n in graph.nodes if n.op != "input"]
    outputs = [{"name": name, "value": names[id(o)]}
               for name, o in zip(exported.output_names, graph.outputs)]
    doc = {
        "format": FORMAT, "version": VERSION, "producer": producer, "name": exported.name,
        "inputs": inputs, "nodes": nodes, "outputs": outputs,
        "n_results": exported.n_results,
        "guards": [{"output": i, "kind": kind, "expected": encode_attr(value)}
                   for i, kind, value in exported.guards],
        "args": exported.args_spec, "results": exported.result_spec,
        "assumptions": list(exported.assumptions),
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8")


def _value_names(exported) -> dict:
    names = {id(n): name for n, name in zip(exported.graph.inputs, exported.input_names)}
    k = 0
    for node in exported.graph.nodes:
        if id(node) not in names:
            names[id(node)] = f"%{k}"  # (no Python name or parameter path has a '%')
            k += 1
    return names


def _node_entry(node, names) -> dict:
    for inp in node.inputs:
        if id(inp) not in names:
            raise ExportError(f"export: {node.op} reads a value that is not in the graph")
    return {"name": names[id(node)], "op": node.op,
            "inputs": [names[id(i)] for i in node.inputs],
            "attrs": {k: _attr_or_fail(node, k, v) for k, v in node.attrs.items()},
            "shape": list(node.shape), "dtype": str(node.dtype)}


def _attr_or_fail(node, key, value):
    try:
        return encode_attr(value)
    except TypeError as exc:
        raise ExportError(f"export: {node.op}'s attribute {key!r}: {exc}") from None


def _array_data(arr) -> dict:
    arr = np.ascontiguousarray(arr)
    little = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    return {"base64": base64.b64encode(little.tobytes()).decode("ascii")}


def encode_attr(value):
    """A typed JSON value: {"int": 3}, {"float": 0.5 | "inf" | "-inf" | "nan" | "-0.0"},
    {"bool": true}, {"str": ...}, {"none": null}, {"tuple": [...]}, {"list": [...]},
    {"dtype": "float32"}, {"array": {"dtype", "shape", "base64"}}."""
    if value is None:
        return {"none": None}
    if isinstance(value, (bool, np.bool_)):
        return {"bool": bool(value)}
    if isinstance(value, (int, np.integer)):
        return {"int": int(value)}
    if isinstance(value, (float, np.floating)):
        return {"float": _float_text(float(value))}
    if isinstance(value, str):
        return {"str": value}
    if isinstance(value, np.dtype):
        return {"dtype": str(value)}
    if isinstance(value, (tuple, list)):
        return {type(value).__name__: [encode_attr(v) for v in value]}
    if isinstance(value, np.ndarray):
        if str(value.dtype) not in DTYPES:
            raise TypeError(f"arrays of dtype {value.dtype} are not exported")
        return {"array": {"dtype": str(value.dtype), "shape": list(value.shape),
                          **_array_data(value)}}
    raise TypeError(f"values of type {type(value).__name__} are not exported")


def _float_text(x):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0 and math.copysign(1.0, x) < 0:
        return "-0.0"
    return x


# ---- reading ------------------------------------------------------------------------------


def loads(data: bytes, sidecar=None) -> ExportedGraph:
    """The ExportedGraph a JSON file holds; `sidecar(name, digest)` returns a reader of
    the sidecar file it names (`get(name, shape, dtype)`). Raises ExportError with what is
    wrong and where (for anything wrong in the file, whatever it trips over)."""
    try:
        return _loads(data, sidecar)
    except ExportError:
        raise
    except (RecursionError, ValueError, TypeError, OverflowError, KeyError, IndexError,
            AttributeError, MemoryError, ArithmeticError) as exc:
        raise ExportError(f"not a valid hybridnet graph file ({type(exc).__name__}: "
                          f"{str(exc)[:200]})") from None


def _loads(data, sidecar) -> ExportedGraph:
    doc = _document(data)
    reader = _Reader(sidecar)
    inputs = _list(doc, "inputs")
    nodes = {}
    graph_inputs, names, weights, n_args = [], [], {}, 0
    for k, entry in enumerate(inputs):
        where = f"inputs[{k}]"
        name = _name(entry, where, nodes)
        shape, dtype = _type_of(entry, where)
        kind = _get(entry, "kind", str, where)
        if kind not in ("arg", "weight") or (kind == "arg" and k != n_args):
            raise ExportError(f"{where}: kind must be 'arg' (arguments first) or 'weight', "
                              f"got {kind!r}")
        node = Node("input", (), {}, shape, dtype)
        if kind == "arg":
            n_args += 1
        else:
            weights[name] = reader.array(_get(entry, "data", dict, where), shape, dtype,
                                         where, name)
        nodes[name] = node
        graph_inputs.append(node)
        names.append(name)
    body = [_node(entry, k, nodes, reader) for k, entry in enumerate(_list(doc, "nodes"))]
    outputs, output_names = _outputs(doc, nodes)
    n_results = _get(doc, "n_results", int, "the file")
    if not 0 <= n_results <= len(outputs):
        raise ExportError(f"n_results {n_results} does not fit {len(outputs)} outputs")
    guards = _guards(doc, len(outputs), n_results)
    graph = Graph(graph_inputs + body, graph_inputs, outputs)
    args, results = _spec(doc.get("args"), "args"), _spec(doc.get("results"), "results")
    if _tensors(args) != n_args or _tensors(results) != n_results:
        raise ExportError(f"the argument and result structures hold {_tensors(args)} and "
                          f"{_tensors(results)} tensors, the graph {n_args} and {n_results}")
    return ExportedGraph(graph, names, n_args, weights, output_names, n_results, guards,
                         args, results,
                         [str(a) for a in _list(doc, "assumptions", required=False)],
                         str(doc.get("name", "graph")))


def _document(data) -> dict:
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ExportError(f"not a hybridnet graph file: the JSON does not parse ({exc}); "
                          "is the file truncated?") from None
    if not isinstance(doc, dict):
        raise ExportError(f"not a hybridnet graph file: the JSON holds a "
                          f"{type(doc).__name__}, not an object")
    if doc.get("format") != FORMAT:
        raise ExportError(f"not a hybridnet graph file: 'format' is {doc.get('format')!r}, "
                          f"expected {FORMAT!r}")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ExportError(f"bad schema version {version!r}")
    if version > VERSION:
        raise ExportError(f"the file has schema version {version}, newer than this "
                          f"hybridnet reads ({VERSION}); upgrade hybridnet to load it")
    return doc


def _get(obj, key, kind, where):
    if not isinstance(obj, dict) or key not in obj:
        raise ExportError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ExportError(f"{where}: field {key!r} must be a {kind.__name__}, got "
                          f"{type(value).__name__}")
    return value


def _list(doc, key, required=True) -> list:
    if key not in doc and not required:
        return []
    return _get(doc, key, list, "the file")


def _name(entry, where, taken) -> str:
    name = _get(entry, "name", str, where)
    if not name or len(name) > 200 or name in taken:
        raise ExportError(f"{where}: the name {name[:40]!r} is empty, too long or used twice")
    return name


def _type_of(entry, where) -> tuple:
    shape = _get(entry, "shape", list, where)
    if len(shape) > MAX_RANK or any(not isinstance(s, int) or isinstance(s, bool) or s < 0
                                    for s in shape):
        raise ExportError(f"{where}: shape {str(shape)[:80]} is not a list of sizes >= 0")
    if math.prod(shape) > MAX_ELEMENTS:
        raise ExportError(f"{where}: shape {shape} declares {math.prod(shape):,} elements, "
                          f"more than {MAX_ELEMENTS:,}")
    dtype = _get(entry, "dtype", str, where)
    if dtype not in DTYPES:
        raise ExportError(f"{where}: dtype {dtype[:40]!r} is not one of {', '.join(DTYPES)}")
    return tuple(shape), np.dtype(dtype)


class _Reader:
    def __init__(self, sidecar):
        self.sidecar, self._side = sidecar, None

    def array(self, data, shape, dtype, where, name):
        """The array `data` holds, checked against its declared shape and dtype before
        anything is decoded or allocated."""
        want = math.prod(shape) * dtype.itemsize
        if "base64" in data:
            text = data["base64"]
            if not isinstance(text, str) or len(text) != 4 * ((want + 2) // 3):
                raise ExportError(f"{where}: {name!r} declares {dtype}{list(shape)} "
                                  f"({want:,} bytes) but its data holds another size")
            try:
                raw = base64.b64decode(text.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError):
                raise ExportError(f"{where}: {name!r}'s data is not base64") from None
            if len(raw) != want:
                raise ExportError(f"{where}: {name!r} holds {len(raw)} bytes, its type "
                                  f"{dtype}{list(shape)} needs {want}")
            return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(
                dtype).reshape(shape)
        if "sidecar" in data:
            return self._from_sidecar(data, shape, dtype, where, name)
        raise ExportError(f"{where}: {name!r} has no data (base64 or sidecar)")

    def _from_sidecar(self, data, shape, dtype, where, name):
        file, digest = data.get("sidecar"), data.get("sha256")
        if self.sidecar is None or not isinstance(file, str) or not isinstance(digest, str):
            raise ExportError(f"{where}: {name!r} lives in a sidecar file (with its sha256), "
                              "which was not given")
        if self._side is None or self._side[0] != (file, digest):
            self._side = ((file, digest), self.sidecar(file, digest))
        return self._side[1].get(name, shape, dtype)

    def attr(self, value, where):
        """An attribute value from its typed JSON form."""
        if not isinstance(value, dict) or len(value) != 1:
            raise ExportError(f"{where}: an attribute must be one typed value like "
                              f"{{\"int\": 3}}, got {str(value)[:60]}")
        (kind, v), = value.items()
        simple = {"none": type(None), "bool": bool, "str": str, "dtype": str}
        if kind in simple and isinstance(v, simple[kind]):
            if kind == "dtype":
                if v not in DTYPES:
                    raise ExportError(f"{where}: dtype {v[:40]!r} is not one of {DTYPES}")
                return np.dtype(v)
            return v
        if kind == "int" and isinstance(v, int) and not isinstance(v, bool):
            return v
        if kind == "float":
            return _float_of(v, where)
        if kind in ("tuple", "list") and isinstance(v, list):
            items = [self.attr(x, where) for x in v]
            return tuple(items) if kind == "tuple" else items
        if kind == "array" and isinstance(v, dict):
            shape, dtype = _type_of(v, where)
            return self.array(v, shape, dtype, where, "the constant")
        raise ExportError(f"{where}: bad attribute value {str(value)[:60]}")


def _float_of(v, where) -> float:
    special = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "-0.0": -0.0}
    if isinstance(v, str) and v in special:
        return special[v]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise ExportError(f"{where}: bad float {str(v)[:40]}")


def _node(entry, k, nodes, reader) -> Node:
    where = f"nodes[{k}]"
    name = _name(entry, where, nodes)
    op = _get(entry, "op", str, where)
    opdef = REGISTRY.get(op)
    if opdef is None:
        raise ExportError(f"{where}: unknown op {op[:60]!r} (not in this hybridnet's op "
                          "registry)")
    if op == "input" or opdef.has(Trait.CONTROL):
        raise ExportError(f"{where}: op {op!r} cannot appear in an exported graph")
    refs = _get(entry, "inputs", list, where)
    if any(not isinstance(r, str) or r not in nodes for r in refs):
        raise ExportError(f"{where}: {op} reads {str(refs)[:80]}: every input must name an "
                          "earlier value")
    if opdef.arity >= 0 and len(refs) != opdef.arity:
        raise ExportError(f"{where}: {op} takes {opdef.arity} inputs, got {len(refs)}")
    raw = _get(entry, "attrs", dict, where)
    unknown = set(raw) - set(opdef.attrs)
    if unknown:
        raise ExportError(f"{where}: {op} has no attribute {sorted(unknown)[0][:40]!r}")
    attrs = {key: reader.attr(v, f"{where}.attrs.{key}") for key, v in raw.items()}
    ins = tuple(nodes[r] for r in refs)
    shape, dtype = _type_of(entry, where)
    if op == "const":
        _check_const(attrs, dtype, where)
    elif _has_float(attrs):
        raise ExportError(f"{where}: {op}'s attributes are integers, not floats")
    try:
        got_shape, got_dtype = opdef.check([i.shape for i in ins], [i.dtype for i in ins],
                                           attrs)
    except (OpError, TypeError, ValueError, KeyError, IndexError) as exc:
        raise ExportError(f"{where}: {op} rejects its inputs: {str(exc)[:200]}") from None
    if tuple(got_shape) != shape or np.dtype(got_dtype) != dtype:
        raise ExportError(f"{where}: {op} gives {np.dtype(got_dtype)}{list(got_shape)}, the "
                          f"file declares {dtype}{list(shape)}")
    node = Node(op, ins, attrs, shape, dtype)
    nodes[name] = node
    return node


def _has_float(value) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return any(_has_float(v) for v in value)
    return False


def _check_const(attrs, dtype, where):
    """A constant's value must be a number or array its dtype holds."""
    value = attrs.get("value")
    if np.dtype(attrs.get("dtype", dtype)) != dtype:
        raise ExportError(f"{where}: the constant's dtype attribute differs from its type")
    if isinstance(value, np.ndarray):
        if value.dtype != dtype:
            raise ExportError(f"{where}: a {dtype} constant holds {value.dtype} data")
        return
    if not isinstance(value, (bool, int, float)):
        raise ExportError(f"{where}: a constant's value must be a number or an array")
    bad = False
    if dtype.kind in "biu":
        whole = not isinstance(value, float) or (math.isfinite(value) and value.is_integer())
        bad = not whole or (dtype.kind == "b" and value not in (0, 1)) or (
            dtype.kind != "b" and not np.iinfo(dtype).min <= int(value) <= np.iinfo(dtype).max)
    elif math.isfinite(value):
        with np.errstate(over="ignore"):
            bad = not np.isfinite(np.asarray(value, dtype=dtype))
    if bad:
        raise ExportError(f"{where}: {value!r} is not a {dtype} value")


def _outputs(doc, nodes) -> tuple:
    outputs, names = [], []
    for k, entry in enumerate(_list(doc, "outputs")):
        where = f"outputs[{k}]"
        name = _get(entry, "name", str, where)
        ref = _get(entry, "value", str, where)
        if ref not in nodes:
            raise ExportError(f"{where}: {ref[:40]!r} names no value of the graph")
        outputs.append(nodes[ref])
        names.append(name)
    return outputs, names


def _guards(doc, n_outputs, n_results) -> list:
    guards = []
    reader = _Reader(None)
    for k, entry in enumerate(_list(doc, "guards", required=False)):
        where = f"guards[{k}]"
        index = _get(entry, "output", int, where)
        kind = _get(entry, "kind", str, where)
        if not n_results <= index < n_outputs or kind not in ("bool", "item"):
            raise ExportError(f"{where}: output {index} / kind {kind[:20]!r} is no guard")
        expected = reader.attr(entry.get("expected"), where)
        if not isinstance(expected, (bool, int, float)):
            raise ExportError(f"{where}: the expected value must be a number")
        guards.append((index, kind, expected))
    return guards


def _tensors(spec) -> int:
    if spec["t"] == "tensor":
        return 1
    return sum(_tensors(s) for s in spec.get("items", ()))


def _spec(spec, where):
    """An args/results structure, checked to hold only the known forms."""
    if not isinstance(spec, dict):
        raise ExportError(f"{where}: the structure must be an object")
    t = spec.get("t")
    if t == "tensor":
        return spec
    if t == "const":
        v = spec.get("value")
        if v is not None and not isinstance(v, (bool, int, float, str)):
            raise ExportError(f"{where}: a constant must be a number, string or null")
        return spec
    if t in ("tuple", "list", "dict") and isinstance(spec.get("items"), list):
        for item in spec["items"]:
            _spec(item, where)
        keys = spec.get("keys")
        if t == "dict" and (not isinstance(keys, list) or len(keys) != len(spec["items"]) or
                            not all(isinstance(k, str) for k in keys)):
            raise ExportError(f"{where}: a dict needs one string key per item")
        return spec
    raise ExportError(f"{where}: unknown structure {str(spec)[:60]}")
