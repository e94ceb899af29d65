"""Record one call of a function or module as an `ExportedGraph` (what `hn.export` writes).

The call runs eagerly once (for real: what it changes stays changed) while the JIT's
recorder watches it (the same
recording `hn.trace` compiles). Arguments' tensors become the graph's first inputs, named
after the function's parameters; every other tensor it read (parameters, buffers,
captured or global tensors) becomes a named weight. A call the JIT could not replay, or
one that updates state (in-place writes, optimizer steps, gradients), cannot be exported
and raises `ExportError` saying why.
"""

import inspect

from compiler.errors import ExportError
from compiler.export import ExportedGraph
from compiler.ir import Node

from .._state import STATE
from ..nn.module import Module
from ..tensor import Tensor
from .keys import module_key
from .pytree import Unsupported, flatten
from .traced import TracedFunction


def capture(fn, args, name=None) -> tuple:
    """(ExportedGraph, eager result) of `fn(*args)`."""
    target = fn.fn if isinstance(fn, TracedFunction) else fn
    traced = TracedFunction(target, dynamic=False)
    label = name or getattr(target, "__name__", type(target).__name__)
    try:
        flat, spec = flatten((tuple(args), {}), module_key=module_key, packs=False)
    except Unsupported as exc:
        raise ExportError(f"export {label}: {exc}") from None
    _refuse_shared(flat, label)
    result, tg = traced._record(flat, args, {}, traced._key(flat, spec))
    if isinstance(tg, Exception):
        raise ExportError(f"export {label}: the call cannot be captured as a graph: {tg}")
    _refuse_state(tg, label)
    if any(c.aliases for c in tg.checks):
        raise ExportError(f"export {label}: a tensor argument is also a tensor the function "
                          "reaches by name (a parameter, global or closure tensor); the "
                          "graph would read it from the argument: pass a copy (t.clone())")
    inputs, names, weights = _inputs(tg, flat, args, target, label)
    graph = tg.graph
    graph.inputs = inputs
    graph.nodes = inputs + [n for n in graph.nodes if n.op != "input"]
    n_res = tg.n_results
    taken = set(names)
    outputs = [_unique(f"output{k}" if n_res > 1 else "output", taken) for k in range(n_res)]
    outputs += [_unique(f"guard{k}", taken) for k in range(len(graph.outputs) - n_res)]
    exported = ExportedGraph(
        graph, names, len(flat), weights, outputs, n_res, list(tg.guards),
        spec_to_json(flatten(tuple(args))[1], label), spec_to_json(tg.result_spec, label),
        _assumptions(tg, target, flat), label)
    return exported, result


def _refuse_shared(flat, label):
    """The same tensor passed as two arguments is one graph input: calls with two tensors
    would read the first twice."""
    seen = {}
    for i, t in enumerate(flat):
        if id(t) in seen:
            raise ExportError(f"export {label}: arguments {seen[id(t)]} and {i} are the same "
                              "tensor; the graph would read one input for both: pass a copy "
                              "(x.clone()) as the second")
        seen[id(t)] = i


def _assumptions(tg, target, flat) -> list:
    """What the recording took as fixed, as text: what it read (guards on state), grad
    mode, the arguments' requires_grad flags, the modules' train/eval modes."""
    found = [check.text for check in tg.checks]
    found.append(f"grad mode was {'on' if STATE.grad else 'off'}")
    flags = [i for i, t in enumerate(flat) if t._rg]
    if flags:
        found.append(f"tensor arguments {flags} required grad")
    owner = target if isinstance(target, Module) else getattr(target, "__self__", None)
    if isinstance(owner, Module):
        modes = {"train" if m.training else "eval" for m in owner.modules()}
        found.append(f"the module was in {' and '.join(sorted(modes))} mode")
    return found


def _refuse_state(tg, label):
    if tg.randoms:
        raise ExportError(f"export {label}: the call draws random numbers (dropout, rand, "
                          "randn); export the model in eval mode, or without random ops")
    kinds = sorted({s.kind for s in tg.sources} - {"arg", "captured"})
    if kinds:
        raise ExportError(f"export {label}: the call reads {' and '.join(kinds)} inputs "
                          "(gradients or optimizer settings): a training step cannot be "
                          "exported; export the model's forward")
    if tg.writebacks or tg.grad_writes or tg.version_bumps:
        raise ExportError(f"export {label}: the call updates tensors in place (an in-place "
                          "op, or a module's buffers such as batch-norm running statistics "
                          "in train mode); export a function without in-place updates, or "
                          "call model.eval() first")


def _inputs(tg, flat, args, target, label) -> tuple:
    """Graph inputs (arguments first, then weights), their names and the weights."""
    graph = tg.graph
    by_arg, weights_at = {}, []
    for node, src in zip(graph.inputs, tg.sources):
        if src.kind == "arg":
            by_arg.setdefault(src.index, node)
        else:
            weights_at.append((node, src.ref()))
    inputs = [by_arg.get(i) or Node("input", (), {}, tuple(t.shape), t._data.dtype)
              for i, t in enumerate(flat)]
    names = _arg_names(target, args, len(flat))
    known = _weight_names(target)
    weights, taken = {}, set(names)
    for k, (node, tensor) in enumerate(weights_at):
        if tensor is None:
            raise ExportError(f"export {label}: a tensor the call read is gone")
        name = _unique(known.get(id(tensor), f"captured{k}"), taken)
        weights[name] = tensor._data.copy()
        inputs.append(node)
        names.append(name)
    return inputs, names, weights


def _unique(name, taken) -> str:
    base, k = name, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def _arg_names(target, args, n_flat) -> list:
    """One name per flat argument tensor: the parameter's name, `name.k` inside a nested
    argument."""
    fn = target.forward if isinstance(target, Module) else target
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = []
    for i, arg in enumerate(args):
        base = params[i] if i < len(params) else f"arg{i}"
        leaves = flatten(arg)[0]
        if len(leaves) == 1 and leaves[0] is arg:
            names.append(base)
        else:
            names.extend(f"{base}.{k}" for k in range(len(leaves)))
    if len(names) != n_flat:  # (cannot happen: the same flattening)
        names = [f"arg{i}" for i in range(n_flat)]
    taken = set()
    return [_unique(n, taken) for n in names]


def _weight_names(target) -> dict:
    """id(tensor) -> a name: `named_parameters()`/`named_buffers()` names of the module
    (or of the modules a function names as globals or closure variables, prefixed by the
    variable), or the variable's name for a tensor."""
    found = {}
    if isinstance(target, Module):
        _module_names(target, "", found)
        return found
    owner = getattr(target, "__self__", None)
    if isinstance(owner, Module):
        _module_names(owner, "", found)
    code = getattr(target, "__code__", None)
    env = dict(getattr(target, "__globals__", {}))
    if code is not None and target.__closure__:
        for var, cell in zip(code.co_freevars, target.__closure__):
            try:
                env[var] = cell.cell_contents
            except ValueError:
                continue
    names = set(code.co_names + code.co_freevars) if code is not None else set()
    for var in sorted(names):
        value = env.get(var)
        if isinstance(value, Module):
            _module_names(value, var + ".", found)
        elif isinstance(value, Tensor):
            found.setdefault(id(value), var)
    return found


def _module_names(module, prefix, found):
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        found.setdefault(id(t), prefix + name)


def spec_to_json(spec, label):
    """A pytree spec (hybridnet.jit.pytree) as plain JSON data (ExportedGraph's form)."""
    tag = spec[0]
    if tag == "T":
        return {"t": "tensor"}
    if tag == "S":
        return {"t": "const", "value": spec[2]}
    if tag == "F":
        return {"t": "const", "value": float.fromhex(spec[2])}
    if tag == "C":
        kind = "list" if spec[1] == "list" else "tuple"
        return {"t": kind, "items": [spec_to_json(s, label) for s in spec[2]]}
    if tag == "D" and all(isinstance(k, str) for k in spec[1]):
        return {"t": "dict", "keys": list(spec[1]),
                "items": [spec_to_json(s, label) for s in spec[2]]}
    raise ExportError(f"export {label}: arguments and results must be tensors, numbers, "
                      "strings, or tuples, lists and string-keyed dicts of them")
