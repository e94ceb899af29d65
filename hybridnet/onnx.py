"""`hn.onnx.export`: PyTorch's `torch.onnx.export` name for hybridnet's ONNX export.

    hn.onnx.export(model, (x,), "model.onnx", input_names=["x"], output_names=["y"])

The model runs once on the example arguments while the JIT records it (as
`hn.export(model, *args, format="onnx")`, docs/export.md and docs/onnx.md): the graph has
the example's shapes and dtypes, the path its Python control flow took, and the weights
as initializers. Options that would change what that graph is (dynamic axes, weights as
inputs, custom ops) raise `hn.ExportError`; options about how PyTorch's exporters work
inside (verbose, constant folding, the dynamo switch, reports) are accepted and ignored;
docs/serialization.md lists them. `onnx` itself is imported only when exporting.
"""

import inspect
import io

from compiler.errors import ExportError
from compiler.export.onnx_export import DEFAULT_OPSET, to_onnx

from .export_load import _write as write_atomically
from .jit.capture_graph import capture


def export(model, args=(), f=None, *, kwargs=None, verbose=None, input_names=None,
           output_names=None, opset_version=None, dynamo=True, external_data=True,
           dynamic_shapes=None, custom_translation_table=None, report=False, optimize=True,
           verify=False, profile=False, dump_exported_program=False, artifacts_dir=".",
           fallback=False, export_params=True, keep_initializers_as_inputs=False,
           dynamic_axes=None, training=None, operator_export_type=None,
           do_constant_folding=True, custom_opsets=None, export_modules_as_functions=False,
           autograd_inlining=True) -> bytes:
    """Export `model(*args, **kwargs)` (an nn.Module or a function of tensors) to ONNX;
    write it to `f` (a path, written atomically, or a binary file object) when given, and
    return the serialized ModelProto's bytes. `args`: a tuple of positional arguments, or
    one tensor. `input_names` name the tensor arguments in order (weights keep their
    `named_parameters()` names), `output_names` the results (then the guard outputs).
    `opset_version`: 17 (the default) or newer."""
    del verbose, dynamo, external_data, report, optimize, verify, profile, artifacts_dir
    del dump_exported_program, fallback, training, do_constant_folding, autograd_inlining
    refused = {"dynamic_axes": dynamic_axes, "dynamic_shapes": dynamic_shapes,
               "custom_opsets": custom_opsets, "custom_translation_table":
               custom_translation_table, "export_modules_as_functions":
               export_modules_as_functions, "keep_initializers_as_inputs":
               keep_initializers_as_inputs, "export_params": not export_params}
    for name, value in refused.items():
        if value:
            raise ExportError(f"onnx.export: {name} is not supported: {_WHY[name]}")
    if operator_export_type not in (None, 0) and str(operator_export_type) != \
            "OperatorExportTypes.ONNX":
        raise ExportError(f"onnx.export: operator_export_type={operator_export_type!r} is not "
                          "supported: hybridnet exports standard ONNX operators only")
    args = _positional(model, args, kwargs)
    exported, _ = capture(model, args)
    _rename(exported, input_names, output_names)
    data = to_onnx(exported, DEFAULT_OPSET if opset_version is None else opset_version)
    if f is not None:
        _write(f, data)
    return data


_WHY = {
    "dynamic_axes": "hybridnet graphs have the example's fixed shapes; export once per "
                    "input shape",
    "dynamic_shapes": "hybridnet graphs have the example's fixed shapes; export once per "
                      "input shape",
    "custom_opsets": "hybridnet emits the default ONNX domain only",
    "custom_translation_table": "hybridnet converts its own ops (docs/onnx.md)",
    "export_modules_as_functions": "hybridnet exports one flat graph",
    "keep_initializers_as_inputs": "weights are always initializers",
    "export_params": "weights are always stored in the model (export_params=True)",
}


def _positional(model, args, kwargs) -> tuple:
    """The positional arguments of the call: `args` as a tuple, then the keyword arguments
    at their parameters' positions (parameters skipped before them take their defaults)."""
    if not isinstance(args, tuple):
        args = (args,)
    if not kwargs:
        return args
    try:
        signature = inspect.signature(getattr(model, "forward", model))
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        raise ExportError(f"onnx.export: the arguments do not fit the model: {exc}") from None
    params = signature.parameters
    names = [n for n, p in params.items()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if set(kwargs) - set(names):
        raise ExportError(f"onnx.export: keyword-only arguments {sorted(set(kwargs) - set(names))}"
                          ": exported graphs take positional arguments only")
    last = max(names.index(k) for k in kwargs)
    return args + tuple(bound.arguments.get(n, params[n].default)
                        for n in names[len(args):last + 1])


def _rename(exported, input_names, output_names) -> None:
    for names, what, count, target in (
            (input_names, "input_names", exported.n_args, exported.input_names),
            (output_names, "output_names", len(exported.graph.outputs),
             exported.output_names)):
        if names is None:
            continue
        names = list(names)
        if len(names) > count or not all(isinstance(n, str) and n for n in names):
            raise ExportError(f"onnx.export: {what} must be at most {count} non-empty "
                              f"strings (the graph has {count}), got {names}")
        if what == "output_names" and len(names) > exported.n_results and \
                len(target) == exported.n_results:
            target.extend(f"guard{k}" for k in range(len(exported.guards)))
        target[:len(names)] = names
    taken = list(exported.input_names) + list(exported.output_names)
    if len(set(taken)) != len(taken):
        clash = sorted({n for n in taken if taken.count(n) > 1})
        raise ExportError(f"onnx.export: the names {clash} are used twice (inputs, weights "
                          "and outputs need distinct names)")


def _write(f, data: bytes) -> None:
    if hasattr(f, "write"):
        if isinstance(f, io.TextIOBase):
            raise TypeError("onnx.export: f is a text file; open it in binary mode ('wb')")
        f.write(data)
        return
    write_atomically(f, data)


__all__ = ["export", "ExportError"]
