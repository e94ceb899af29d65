"""ONNX export of an `ExportedGraph`: `to_onnx(exported, opset=17) -> bytes`.

Opset: 17 by default, and the least accepted (`MIN_OPSET`). Everything emitted here
exists in it (ScatterElements with reduction="add" needs 16, Reshape's allowzero 14,
ReduceSum/Unsqueeze/Clip with axes and bounds as inputs 13), it is the last opset whose
ReduceMax/ReduceMin take `axes` as an attribute, and runtimes widely support it. From
opset 18 on those take `axes` as an input, and the converter emits whichever form the
requested opset has, so any opset from 17 to the installed `onnx` package's newest is
accepted (runtimes support fewer; 17, 18 and 21 are tested). The model's IR version is
the lowest the opset needs.

The graph: the arguments are graph inputs (their names, shapes and dtypes), the weights
initializers (their names), constants initializers (`c0`, `c1`, ...; equal constants
shared), every hybridnet node one or a few ONNX nodes found by op name in `CONVERTERS`
(ops in `UNSUPPORTED` are refused with the reason given there). Each result is a graph
output named as in `output_names`; each guard value an output `guard{k}` (or the name
`output_names` gives it, when it names the guards too), whose expected value the
output's doc string and the model's metadata (`hybridnet.guards`, JSON) record: an ONNX
runtime cannot check it, the caller must. Value names are `v{k}` (the k-th converted
node; `v{k}.1`, ... for the values its converter makes on the way), so the same graph
always gives the same bytes. `onnx` is optional and imported by `to_onnx` only.
Every hybridnet value's shape and dtype is declared in the graph's value_info, so
`onnx.checker.check_model(full_check=True)`, which `to_onnx` runs, checks them against
ONNX's own shape inference.

Semantics follow the registry's NumPy impls, dtypes included; where an ONNX op or
onnxruntime's kernels differ, the converter adds nodes: bool add/mul/maximum/minimum
are Or/And, bool where is And/Or/Not, bool orderings compare int32, bool sums count in
int64; max/min reductions and argmax/argmin return NaN / the first NaN's index when
there is one (as NumPy; onnxruntime skips NaNs); float64 erf (which onnxruntime lacks)
is a 24-point Gauss-Legendre quadrature of its integral in float64 (within 2e-15);
reshape sets allowzero (a 0 in a shape is a size, not "copy"); pad_slice with steps is
Reshape/Pad/Reshape/Slice then Pad; unfold is a Gather of window positions computed at
export time, fold a ScatterElements(reduction="add") at the same positions. docs/onnx.md
has the op table.
"""

import json
import math

import numpy as np

from ..errors import ExportError
from ..ir import collect
from .exported import ExportedGraph
from .onnx_common import _BOOL, _I32, _I64, _is_bool, _is_float, _norm
from .onnx_more import MORE_CONVERTERS

DEFAULT_OPSET = 17
MIN_OPSET = 17
_MISSING = "format='onnx' needs the onnx package: pip install 'hybridnet[onnx]'"
_ERF_POINTS = 24  # Gauss-Legendre points of the float64 erf (max error 2e-15)
_ERF_CLIP = 6.0  # erf(6) rounds to 1.0 in float64


# ---- the builder ------------------------------------------------------------------------


class _Builder:
    """Collects ONNX nodes, initializers and value infos with unique, deterministic names."""

    def __init__(self, onnx, opset: int, reserved):
        self.onnx = onnx
        self.opset = opset
        self.nodes, self.initializers, self.value_info = [], [], []
        self.prefix = "v"
        self.made = set()  # the values emit() made
        self._used = set(reserved)
        self._consts = {}

    def fresh(self, base: str) -> str:
        """`base`, or `base.1`, `base.2`, ... : the first name not yet taken."""
        name, k = base, 0
        while name in self._used:
            k += 1
            name = f"{base}.{k}"
        self._used.add(name)
        return name

    def emit(self, op_type: str, inputs, **attrs) -> str:
        """One ONNX node with one output; returns the output's name."""
        out = self.fresh(self.prefix)
        self.made.add(out)
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), [out], name=out,
                                                     **attrs))
        return out

    def output(self, value: str, name: str) -> None:
        """Identity from `value` to the graph output `name`."""
        self.nodes.append(self.onnx.helper.make_node("Identity", [value], [name],
                                                     name=f"output:{name}"))

    def const(self, array) -> str:
        """An initializer holding `array` (equal arrays share one)."""
        array = np.asarray(array, order="C")
        key = (str(array.dtype), array.shape, array.tobytes())
        if key not in self._consts:
            name = self.fresh(f"c{len(self._consts)}")
            self.initializers.append(self.onnx.numpy_helper.from_array(array, name))
            self._consts[key] = name
        return self._consts[key]

    def ints(self, values) -> str:
        """A 1-D int64 initializer (shapes, axes, pads, starts...)."""
        return self.const(np.asarray(list(values), dtype=np.int64).reshape(-1))

    def scalar(self, value, dtype) -> str:
        """A 0-d initializer of `dtype`."""
        return self.const(np.asarray(value, dtype=dtype))

    def tensor_type(self, dtype) -> int:
        """The ONNX TensorProto element type of a NumPy dtype."""
        return self.onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))

    def cast(self, value: str, dtype) -> str:
        """`value` cast to `dtype`."""
        return self.emit("Cast", [value], to=self.tensor_type(dtype))

    def reduce(self, op_type: str, value: str, axes, keepdims: bool) -> str:
        """A Reduce* node over `axes` (an input for ReduceSum, and for ReduceMax/Min from
        opset 18; an attribute before)."""
        keep = int(bool(keepdims))
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.emit(op_type, [value, self.ints(axes)], keepdims=keep)
        return self.emit(op_type, [value], axes=list(axes), keepdims=keep)

    def zeros(self, shape, dtype) -> str:
        """Zeros of `shape` and `dtype` (ConstantOfShape)."""
        zero = self.onnx.numpy_helper.from_array(np.zeros((1,), dtype=dtype))
        return self.emit("ConstantOfShape", [self.ints(shape)], value=zero)

    def info(self, name: str, shape, dtype):
        """A ValueInfoProto for `name`."""
        return self.onnx.helper.make_tensor_value_info(name, self.tensor_type(dtype),
                                                       list(shape))


# ---- elementwise converters -------------------------------------------------------------


def _unary(op_type: str, on_bool=None):
    """x -> op_type(x); on bool input the identity when `on_bool` is "identity"."""
    def convert(b, node, ins):
        if on_bool == "identity" and _is_bool(node.inputs[0].dtype):
            return ins[0]
        return b.emit(op_type, ins)
    convert.__doc__ = f"{op_type} (elementwise)"
    return convert


def _erf(b, node, ins):
    """Erf; in float64 (which onnxruntime has no Erf kernel for) the quadrature
    erf(x) = x * sum_i w_i/sqrt(pi) * exp(-(x * h_i)**2) over Gauss-Legendre points,
    x clipped to +-6 first (beyond, erf is +-1.0 in float64; NaN stays NaN)."""
    dtype = node.inputs[0].dtype
    if dtype != np.float64:
        return b.emit("Erf", ins)
    u, w = np.polynomial.legendre.leggauss(_ERF_POINTS)
    xc = b.emit("Clip", [ins[0], b.scalar(-_ERF_CLIP, dtype), b.scalar(_ERF_CLIP, dtype)])
    t = b.emit("Mul", [b.emit("Unsqueeze", [xc, b.ints([-1])]), b.const((u + 1) / 2)])
    e = b.emit("Exp", [b.emit("Neg", [b.emit("Mul", [t, t])])])
    return b.emit("Mul", [xc, b.emit("MatMul", [e, b.const(w / math.sqrt(math.pi))])])


def _binary(op_type: str, bool_op: str = None):
    """(a, b) -> op_type(a, b) with NumPy broadcasting; `bool_op` on bool operands."""
    def convert(b, node, ins):
        if bool_op is not None and _is_bool(node.inputs[0].dtype):
            return b.emit(bool_op, ins)
        return b.emit(op_type, ins)
    convert.__doc__ = f"{op_type} (elementwise, broadcasting)"
    return convert


def _compare(op_type: str, negate: bool = False):
    """A comparison giving bool; bool operands of an ordering compare as int32."""
    def convert(b, node, ins):
        if op_type != "Equal" and _is_bool(node.inputs[0].dtype):
            ins = [b.cast(v, _I32) for v in ins]
        out = b.emit(op_type, ins)
        return b.emit("Not", [out]) if negate else out
    convert.__doc__ = f"{'Not ' if negate else ''}{op_type} (bool result)"
    return convert


def _where(b, node, ins):
    """Where; with bool branches (no onnxruntime kernel) (c and a) or (not c and b)."""
    cond, x, y = ins
    if not _is_bool(node.dtype):
        return b.emit("Where", ins)
    return b.emit("Or", [b.emit("And", [cond, x]),
                         b.emit("And", [b.emit("Not", [cond]), y])])


def _cast(b, node, ins):
    """Cast (float to int truncates toward zero, as NumPy's astype)."""
    if node.dtype == node.inputs[0].dtype:
        return ins[0]
    return b.cast(ins[0], node.dtype)


# ---- reductions -------------------------------------------------------------------------

_REDUCE = {"add": "ReduceSum", "max": "ReduceMax", "min": "ReduceMin"}


def _any_nan(b, value: str, axes, keepdims: bool) -> tuple:
    """(isnan as int32, whether `axes` hold a NaN as bool, reduced as asked)."""
    isnan = b.cast(b.emit("IsNaN", [value]), _I32)
    found = b.reduce("ReduceMax", isnan, axes, keepdims)
    return isnan, b.cast(found, _BOOL)


def _reduce(b, node, ins):
    """sum/max/min over `dims` (the op's `combine`): ReduceSum/Max/Min. No dims or a 0-d
    input: the identity, as NumPy. Bool: sum counts in int64 then tests != 0 (NumPy's
    dtype-kept add.reduce is `any`), max/min reduce int32. Float max/min give NaN when
    the reduced values hold one (onnxruntime skips NaNs)."""
    x = node.inputs[0]
    dims = sorted({_norm(d, len(x.shape)) for d in node.attrs["dims"]})
    keep = bool(node.attrs["keepdim"])
    if not dims or not x.shape:
        return ins[0]
    op_type = _REDUCE[node.opdef.combine]
    if _is_bool(x.dtype):
        inner = _I64 if op_type == "ReduceSum" else _I32
        return b.cast(b.reduce(op_type, b.cast(ins[0], inner), dims, keep), _BOOL)
    out = b.reduce(op_type, ins[0], dims, keep)
    if op_type == "ReduceSum" or not _is_float(x.dtype):
        return out
    _, found = _any_nan(b, ins[0], dims, keep)
    return b.emit("Where", [found, b.scalar(np.nan, x.dtype), out])


def _arg(op_type: str):
    """argmax/argmin: ArgMax/ArgMin (int64, the first index of ties: select_last_index=0);
    dim=None flattens first; a 0-d input gives 0; floats: the first NaN's index when the
    values hold one (NumPy), bool compares as int32."""
    def convert(b, node, ins):
        x, dim, keep = node.inputs[0], node.attrs["dim"], bool(node.attrs["keepdim"])
        if not x.shape:
            return b.scalar(0, _I64)
        value, axis, inner_keep = ins[0], 0, keep
        if dim is None:
            value, inner_keep = b.emit("Reshape", [value, b.ints([math.prod(x.shape)])]), False
        else:
            axis = _norm(dim, len(x.shape))
        if _is_bool(x.dtype):
            value = b.cast(value, _I32)
        attrs = {"axis": axis, "keepdims": int(inner_keep), "select_last_index": 0}
        out = b.emit(op_type, [value], **attrs)
        if _is_float(x.dtype):
            isnan, found = _any_nan(b, value, [axis], inner_keep)
            out = b.emit("Where", [found, b.emit("ArgMax", [isnan], **attrs), out])
        if dim is None and keep:
            out = b.emit("Reshape", [out, b.ints([1] * len(x.shape))])
        return out
    convert.__doc__ = _arg.__doc__
    return convert


# ---- movement and indexing --------------------------------------------------------------


def _reshape(b, node, ins):
    """Reshape to the (fully known) shape, an int64 initializer; allowzero=1."""
    if tuple(node.shape) == tuple(node.inputs[0].shape):
        return ins[0]
    return b.emit("Reshape", [ins[0], b.ints(node.shape)], allowzero=1)


def _permute(b, node, ins):
    """Transpose (the identity permutation, 0-d included, emits nothing)."""
    dims = [int(d) for d in node.attrs["dims"]]
    if dims == list(range(len(dims))):
        return ins[0]
    return b.emit("Transpose", ins, perm=dims)


def _expand(b, node, ins):
    """Expand to the target shape (an int64 initializer)."""
    if tuple(node.shape) == tuple(node.inputs[0].shape):
        return ins[0]
    return b.emit("Expand", [ins[0], b.ints(node.shape)])


def _identity(b, node, ins):
    """The input itself (detach: gradients do not exist in ONNX)."""
    return ins[0]


def _slice(b, node, ins):
    """Slice over the dims `index` does not take whole (starts, ends, axes, steps)."""
    shape = node.inputs[0].shape
    cut = [(d, r) for d, (r, size) in enumerate(zip(node.attrs["index"], shape))
           if tuple(r) != (0, size, 1)]
    if not cut:
        return ins[0]
    cols = list(zip(*[(start, stop, d, step) for d, (start, stop, step) in cut]))
    return b.emit("Slice", [ins[0]] + [b.ints(c) for c in cols])


def _spread(b, value, shape, index, strided):
    """Put `step - 1` zeros between the elements of each dim in `strided` and drop the
    trailing ones: a dim of n elements becomes (n - 1) * step + 1 long."""
    split, pads, merged, ends = [], [], [], []
    for d, size in enumerate(shape):
        step = index[d][2]
        if d in strided:
            split += [size, 1]
            pads += [0, step - 1]
            merged.append(size * step)
            ends.append((size - 1) * step + 1)
        else:
            split.append(size)
            pads.append(0)
            merged.append(size)
    value = b.emit("Reshape", [value, b.ints(split)])
    value = b.emit("Pad", [value, b.ints([0] * len(pads) + pads)])
    value = b.emit("Reshape", [value, b.ints(merged)])
    return b.emit("Slice", [value, b.ints([0] * len(strided)), b.ints(ends),
                            b.ints(strided)])


def _pad_slice(b, node, ins):
    """Zeros of `shape` with the input at `index`: Pad for step 1; for larger steps the
    input is spread out first (`_spread`); an empty input gives ConstantOfShape zeros."""
    src, shape, index = node.inputs[0], node.attrs["shape"], node.attrs["index"]
    if math.prod(src.shape) == 0:
        return b.zeros(shape, node.dtype)
    strided = [d for d, n in enumerate(src.shape) if n > 1 and index[d][2] > 1]
    value = _spread(b, ins[0], src.shape, index, strided) if strided else ins[0]
    spans = [(n - 1) * r[2] + 1 for n, r in zip(src.shape, index)]
    begin = [r[0] for r in index]
    end = [size - start - span for size, start, span in zip(shape, begin, spans)]
    if not any(begin + end):
        return value
    return b.emit("Pad", [value, b.ints(begin + end)])


def _cat(b, node, ins):
    """Concat along `dim`."""
    return b.emit("Concat", ins, axis=_norm(node.attrs["dim"], len(node.shape)))


def _take(b, node, ins):
    """Gather along `dim` (negative indices count from the end in both)."""
    return b.emit("Gather", ins, axis=_norm(node.attrs["dim"], len(node.inputs[0].shape)))


def _scatter_add(b, node, ins):
    """ScatterElements(reduction="add") onto ConstantOfShape zeros: the index dims of the
    source are merged into one, the indices broadcast over the other dims (as np.add.at
    reads them); bool adds (logical or) in int32."""
    src, idx = node.inputs
    dim = node.attrs["dim"]
    lead, rest = tuple(src.shape[:dim]), tuple(src.shape[dim + len(idx.shape):])
    m = math.prod(idx.shape)
    updates_shape = lead + (m,) + rest
    updates, indices = ins
    if tuple(src.shape) != updates_shape:
        updates = b.emit("Reshape", [updates, b.ints(updates_shape)], allowzero=1)
    indices = b.emit("Reshape", [indices, b.ints((1,) * len(lead) + (m,) + (1,) * len(rest))],
                     allowzero=1)
    if tuple((1,) * len(lead) + (m,) + (1,) * len(rest)) != updates_shape:
        indices = b.emit("Expand", [indices, b.ints(updates_shape)])
    work = _I32 if _is_bool(node.dtype) else node.dtype
    if work != node.dtype:
        updates = b.cast(updates, work)
    out = b.emit("ScatterElements", [b.zeros(node.shape, work), indices, updates], axis=dim,
                 reduction="add")
    return b.cast(out, node.dtype) if work != node.dtype else out


def _matmul(b, node, ins):
    """MatMul (NumPy matmul semantics, batch dims broadcast; 1-D operands behave as in
    NumPy too, though the registry's rule only admits ndim >= 2)."""
    return b.emit("MatMul", ins)


def _const(b, node, ins):
    """A constant: an initializer (equal constants share one)."""
    return b.const(np.asarray(node.attrs["value"], dtype=node.dtype))


CONVERTERS = {
    "const": _const,
    "neg": _unary("Neg"), "exp": _unary("Exp"), "log": _unary("Log"),
    "sqrt": _unary("Sqrt"), "sin": _unary("Sin"), "cos": _unary("Cos"),
    "tanh": _unary("Tanh"), "sigmoid": _unary("Sigmoid"), "erf": _erf,
    "abs": _unary("Abs", "identity"), "sign": _unary("Sign", "identity"),
    "add": _binary("Add", "Or"), "sub": _binary("Sub"), "mul": _binary("Mul", "And"),
    "div": _binary("Div"), "pow": _binary("Pow"),
    "maximum": _binary("Max", "Or"), "minimum": _binary("Min", "And"),
    "lt": _compare("Less"), "le": _compare("LessOrEqual"), "gt": _compare("Greater"),
    "ge": _compare("GreaterOrEqual"), "eq": _compare("Equal"),
    "ne": _compare("Equal", negate=True),
    "where": _where, "cast": _cast,
    "sum": _reduce, "max": _reduce, "min": _reduce,
    "argmax": _arg("ArgMax"), "argmin": _arg("ArgMin"),
    "reshape": _reshape, "permute": _permute, "expand": _expand, "detach": _identity,
    "slice": _slice, "pad_slice": _pad_slice, "cat": _cat, "take": _take,
    "scatter_add": _scatter_add, "matmul": _matmul,
}
"""Op name -> converter(builder, node, input value names) -> the node's value name."""

UNSUPPORTED = {
    "loop": "a rerolled loop is compiler-internal: exported graphs are captured before "
            "rerolling (export the unrolled graph)",
    "loop_out": "a loop's projection is compiler-internal: exported graphs are captured "
                "before rerolling (export the unrolled graph)",
    "input": "graph inputs are bound from the signature (arguments become graph inputs, "
             "weights initializers); an input node outside graph.inputs cannot be exported",
}
"""Op name -> why ONNX export refuses it."""


# ---- the graph --------------------------------------------------------------------------


def _import_onnx():
    """The onnx package (its __init__ loads helper, numpy_helper, checker and defs)."""
    try:
        import onnx
    except ImportError:
        raise ExportError(_MISSING) from None
    return onnx


def _check_signature(ex: ExportedGraph) -> None:
    g = ex.graph
    where = f"to_onnx({ex.name!r})"
    if len(ex.input_names) != len(g.inputs) or not 0 <= ex.n_args <= len(g.inputs):
        raise ExportError(f"{where}: {len(ex.input_names)} input names, {ex.n_args} "
                          f"arguments for {len(g.inputs)} graph inputs")
    if ex.n_results + len(ex.guards) != len(g.outputs) or \
            len(ex.output_names) not in (ex.n_results, len(g.outputs)):
        raise ExportError(f"{where}: {len(ex.output_names)} output names, {ex.n_results} "
                          f"results and {len(ex.guards)} guards for {len(g.outputs)} outputs")
    names = list(ex.input_names) + _output_names(ex)
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        raise ExportError(f"{where}: input and output names must be distinct non-empty "
                          f"strings, got {names}")
    for k, (index, _, _) in enumerate(ex.guards):
        if index != ex.n_results + k:
            raise ExportError(f"{where}: guard {k} reads output {index}, expected "
                              f"{ex.n_results + k} (guards follow the results in order)")
    for node, name in zip(ex.weight_inputs, ex.input_names[ex.n_args:]):
        arr = np.asarray(ex.weights[name]) if name in ex.weights else None
        if arr is None or arr.shape != tuple(node.shape) or arr.dtype != node.dtype:
            got = "nothing" if arr is None else f"{arr.dtype}{list(arr.shape)}"
            raise ExportError(f"{where}: weight {name!r} should be {node.type_str()}, "
                              f"got {got}")


def _output_names(ex) -> list:
    """The results' names, then the guards': `output_names` may name the guard outputs
    too (as `hn.export`'s capture does); otherwise they are `guard{k}`."""
    if len(ex.output_names) > ex.n_results:
        return list(ex.output_names)
    return list(ex.output_names) + [f"guard{k}" for k in range(len(ex.guards))]


def _bind_inputs(b, ex) -> tuple:
    """(graph input infos, {id(node): value name}); weights become initializers."""
    infos, env = [], {}
    for k, (node, name) in enumerate(zip(ex.graph.inputs, ex.input_names)):
        env[id(node)] = name
        if k < ex.n_args:
            infos.append(b.info(name, node.shape, node.dtype))
        else:
            arr = np.asarray(ex.weights[name], order="C")
            b.initializers.append(b.onnx.numpy_helper.from_array(arr, name))
    return infos, env


def _converter(op: str):
    if op in CONVERTERS:
        return CONVERTERS[op]
    if op in UNSUPPORTED:
        raise ExportError(f"to_onnx: op {op!r} cannot be exported to ONNX: {UNSUPPORTED[op]}")
    raise ExportError(f"to_onnx: op {op!r} has no ONNX converter (add one to "
                      f"compiler.export.onnx_export.CONVERTERS, or a reason to UNSUPPORTED)")


def _convert_nodes(b, graph, env) -> None:
    """Convert every node the outputs depend on, in graph order, declaring each value's
    shape and dtype in value_info. Values are named by their position among the
    converted nodes (`v0`, `v1`, ...), so where the inputs sit in `graph.nodes` does not
    matter."""
    live = {id(n) for n in collect(graph.outputs)}
    declared, typed = set(), set()
    for node in graph.nodes:
        if id(node) not in live or id(node) in env:
            continue
        convert = _converter(node.op)
        if not all(id(x) in env for x in node.inputs):
            raise ExportError(f"to_onnx: {node!r} reads a value that is neither a graph "
                              f"input nor defined before it in graph.nodes")
        b.prefix = f"v{len(declared)}"
        value = convert(b, node, [env[id(x)] for x in node.inputs])
        env[id(node)] = value
        declared.add(id(node))
        if value in b.made and value not in typed:
            typed.add(value)
            b.value_info.append(b.info(value, node.shape, node.dtype))


def _guard_doc(kind, expected) -> str:
    return (f"hybridnet guard ({kind}): the graph is valid only where this value is "
            f"{_plain(expected)!r}; check it after running (ONNX runtimes do not)")


def _bind_outputs(b, ex, env) -> list:
    infos = []
    names = _output_names(ex)
    docs = [""] * ex.n_results + [_guard_doc(kind, value) for _, kind, value in ex.guards]
    for node, name, doc in zip(ex.graph.outputs, names, docs):
        b.output(env[id(node)], name)
        infos.append(b.onnx.helper.make_tensor_value_info(
            name, b.tensor_type(node.dtype), list(node.shape), doc_string=doc))
    return infos


def _metadata(ex) -> dict:
    guards = [{"output": name, "kind": kind, "expected": _plain(value)}
              for name, (_, kind, value) in zip(_output_names(ex)[ex.n_results:], ex.guards)]
    return {"hybridnet.guards": json.dumps(guards, sort_keys=True),
            "hybridnet.args_spec": json.dumps(ex.args_spec, sort_keys=True, default=str),
            "hybridnet.result_spec": json.dumps(ex.result_spec, sort_keys=True, default=str)}


def _plain(value):
    """A guard's expected value as a JSON number or bool."""
    return value.item() if isinstance(value, np.generic) else value


def _check_opset(onnx, opset) -> None:
    newest = onnx.defs.onnx_opset_version()
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= newest:
        raise ExportError(f"to_onnx: opset {opset!r} is not supported: choose one from "
                          f"{MIN_OPSET} to {newest} (the installed onnx package's newest)")


def to_onnx(exported: ExportedGraph, opset: int = DEFAULT_OPSET) -> bytes:
    """`exported` as a serialized ONNX ModelProto (default-domain opset `opset`, 17 by
    default), checked with `onnx.checker.check_model(full_check=True)`. Raises
    ExportError when onnx is missing, the signature is inconsistent, an op has no ONNX
    form (naming it) or the checker refuses the model."""
    onnx = _import_onnx()
    _check_opset(onnx, opset)
    _check_signature(exported)
    helper = onnx.helper
    b = _Builder(onnx, opset, list(exported.input_names) + _output_names(exported))
    inputs, env = _bind_inputs(b, exported)
    _convert_nodes(b, exported.graph, env)
    outputs = _bind_outputs(b, exported, env)
    doc = (f"hybridnet graph {exported.name!r}, exported to ONNX opset {opset}: "
           f"{exported.n_args} arguments, {len(exported.weight_inputs)} weights (initializers), "
           f"{exported.n_results} results, {len(exported.guards)} guard outputs (see "
           f"metadata hybridnet.guards)")
    graph = helper.make_graph(b.nodes, exported.name, inputs, outputs,
                              initializer=b.initializers, doc_string=doc,
                              value_info=b.value_info)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="hybridnet",
                              doc_string=doc, ir_version=helper.find_min_ir_version_for(opsets))
    helper.set_model_props(model, _metadata(exported))
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # noqa: BLE001  (the checker raises several kinds)
        raise ExportError(f"to_onnx({exported.name!r}): the ONNX checker refused the model: "
                          f"{type(exc).__name__}: {exc}") from exc
    return model.SerializeToString(deterministic=True)

CONVERTERS.update(MORE_CONVERTERS)
