"""The record of a graph lowered by the llvm backend (no llvmlite here: a kernel loaded
from the disk cache is rebuilt from this record without lowering anything).
"""

import json
from dataclasses import dataclass, field

import numpy as np

from .. import blas
from ..errors import LoweringError
from ..ir import pad_shape as _pad
from ..loop import is_loop
from ..registry import lowering_refusal
from .llvm_arena import ALIGN

ENTRY = "hn_entry"
# What a kernel's function table may hold (compiler.blas.scipy_pointers)
_FNS = {"sgemm", "dgemm", blas.SET_THREADS, blas.THREADS}
CALL = "hn_call"  # (compiler.lowering.llvm_call)
# The ops the llvm backend lowers (the keys of llvm_scalar.RULES and llvm_nodes.NODE_RULES,
# and the reductions; a test keeps them equal), and the dtypes it has types for.
SCALAR_OPS = frozenset({
    "add", "sub", "mul", "div", "pow", "lt", "le", "gt", "ge", "eq", "ne", "maximum",
    "minimum", "neg", "abs", "sign", "sigmoid", "exp", "log", "sqrt", "sin", "cos", "tanh",
    "erf", "where", "cast", "detach", "expand"})
NODE_OPS = frozenset({"reshape", "permute", "slice", "pad_slice", "cat", "matmul", "loop",
                      "loop_out", "take", "scatter_add", "unfold", "fold",
                      "argmax", "argmin", "cumsum"})
LOOP_OPS = frozenset({"loop", "loop_out"})
REDUCTIONS = frozenset({"sum", "max", "min"})
DTYPE_KINDS = "fbiu"


def check_llvm_supported(graph, loops=False) -> None:
    """Raise LoweringError naming the first node the llvm backend cannot take (without
    importing llvmlite: a kernel loaded from the disk cache needs no LLVM). `loops`: may
    it take loop nodes (for the trip count traced)?"""
    ops = SCALAR_OPS | NODE_OPS | REDUCTIONS | LOOP_OPS
    for node in graph.nodes:
        if node.is_source:
            continue
        if is_loop(node) and not loops:
            raise LoweringError("the llvm backend compiles a loop for the traced trip count "
                                "only (with dynamic=False); this loop must serve every "
                                "length")
        if node.op not in ops:
            raise LoweringError(f"the llvm backend cannot lower op {node.op!r} yet")
        if is_loop(node):
            check_llvm_supported(node.attrs["spec"].body, loops)
        if any(d == 0 for d in node.shape):
            raise LoweringError(f"{node.op}: size-0 dims are run eagerly ({node.type_str()})")
        why = lowering_refusal(node)
        if why:
            raise LoweringError(why)
        for v in (node, *node.inputs):
            dt = np.dtype(v.dtype)
            if dt.kind not in DTYPE_KINDS or (dt.kind == "f" and dt.itemsize not in (4, 8)):
                raise LoweringError(f"the llvm backend has no type for {dt}")


def array_consts(graph) -> list:
    """The graph's array constants, in the order the kernel takes them: its own, then
    each loop body's (depth first)."""
    out = [n for n in graph.nodes if n.op == "const" and np.ndim(n.attrs["value"])]
    for node in graph.nodes:
        if is_loop(node):
            out += array_consts(node.attrs["spec"].body)
    return out


def loop_const_starts(graph) -> dict:
    """id(loop node) -> where its body's constants start in array_consts(graph)."""
    at = sum(1 for n in graph.nodes if n.op == "const" and np.ndim(n.attrs["value"]))
    starts = {}
    for node in graph.nodes:
        if is_loop(node):
            starts[id(node)] = at
            at += len(array_consts(node.attrs["spec"].body))
    return starts


@dataclass
class LLProgram:
    """What the llvm engine needs to compile and call a lowered graph."""

    source: str  # the module's IR text (also what `.source` and `.llvm_ir` show first)
    inputs: list  # (padded shape, dtype) per graph input
    consts: list  # arrays passed after the inputs
    outputs: list  # (padded shape, dtype) per output
    temps: list  # bytes of each temporary
    fns: list  # BLAS routine names, in `fns` order
    units: list
    notes: list = field(default_factory=list)
    entry: str = ENTRY
    shape_generic: bool = False
    uses_blas: bool = False
    large_products: bool = False
    single_output: bool = False
    may_exit: bool = False
    parallel: bool = False
    split_rows: int = 0  # > 0: threads share dim 0's rows (split_rows)
    chunks: list = field(default_factory=list)
    driver: str = ""
    globals: dict = field(default_factory=dict)
    cost: int = 0
    same_as: list = field(default_factory=list)  # per output: the output it repeats
    status: int = -1  # the temporary holding the status byte (-1: none)
    temp_offsets: list = field(default_factory=list)  # per temporary, in the arena
    arena: int = 0  # bytes of the scratch arena (llvm_arena.plan)

    def to_meta(self) -> dict:
        """Plain data for the disk cache (JSON): everything but the constants and units.
        (A kernel for every length, compiler.lowering.llvm_sym, writes its affine sizes as
        [a, b] and its length's bounds; runtime.llvm_engine.compile_symbolic compares the
        record with its own program's.)"""
        meta = {"source": self.source, "entry": self.entry,
                "temps": [_size(t) for t in self.temps],
                "inputs": [[[_size(x) for x in s], str(d)] for s, d in self.inputs],
                "outputs": [[[_size(x) for x in s], str(d)] for s, d in self.outputs],
                "fns": list(self.fns), "uses_blas": self.uses_blas,
                "large_products": self.large_products, "single_output": self.single_output,
                "split_rows": self.split_rows, "notes": list(self.notes),
                "same_as": list(self.same_as), "status": self.status,
                "temp_offsets": list(self.temp_offsets), "arena": self.arena}
        sym = getattr(self, "sym", None)
        if sym is not None:
            meta["symbolic"] = [sym[0], sym[1], _size(sym[2]), list(self.apart), self.min_n,
                                self.max_n]
        return meta

    @classmethod
    def from_meta(cls, meta, graph, units) -> "LLProgram":
        """The record of `graph` from `to_meta()` data (constants taken from the graph)."""
        def typed(rows):
            return [(tuple(int(d) for d in s), np.dtype(str(d))) for s, d in rows]
        consts = [np.ascontiguousarray(np.asarray(n.attrs["value"], n.dtype))
                  for n in array_consts(graph)]
        p = cls(str(meta["source"]), typed(meta["inputs"]), consts, typed(meta["outputs"]),
                [int(t) for t in meta["temps"]], [str(f) for f in meta["fns"]], units)
        p.entry = str(meta["entry"])
        p.uses_blas, p.large_products = bool(meta["uses_blas"]), bool(meta["large_products"])
        p.single_output, p.split_rows = bool(meta["single_output"]), int(meta["split_rows"])
        p.parallel = bool(p.split_rows)
        p.notes = [str(n) for n in meta["notes"]] + ["loaded from the disk cache"]
        p.same_as = [int(j) for j in meta["same_as"]]
        p.status = int(meta["status"])
        p.temp_offsets, p.arena = [int(o) for o in meta["temp_offsets"]], int(meta["arena"])
        want = ([(tuple(_pad(n.shape)), np.dtype(n.dtype)) for n in graph.inputs],
                [(tuple(_pad(n.shape)), np.dtype(n.dtype)) for n in graph.outputs])
        first = {}
        same = [first.setdefault(id(o), j) for j, o in enumerate(graph.outputs)]
        if (p.inputs, p.outputs) != want or any(t < 0 for t in p.temps) or p.same_as != same or \
                not _arena_ok(p) or \
                not -1 <= p.status < len(p.temps) or \
                p.entry != ENTRY or not set(p.fns) <= _FNS:
            raise ValueError("the record does not match the graph")
        p.finish()
        return p

    def finish(self):
        """Fill in what program_key compares besides the IR: the calling convention and
        the constants."""
        self.driver = repr((self.inputs, self.outputs, self.temps, self.temp_offsets,
                            self.arena, self.fns))
        self.globals = {f"C{j}": c for j, c in enumerate(self.consts)}
        self.cost = self.source.count("\n")


def _size(x):
    """A size for JSON: an int, or [a, b] for an affine size a*n + b (llvm_sym.Affine)."""
    return [int(x.a), int(x.b)] if hasattr(x, "a") else int(x)


def _arena_ok(p) -> bool:
    """Does every temporary lie inside the arena, at an aligned offset?"""
    return len(p.temp_offsets) == len(p.temps) and all(
        0 <= o and o % ALIGN == 0 and o + t <= p.arena for o, t in zip(p.temp_offsets, p.temps))


def dumps(meta) -> bytes:
    return json.dumps(meta, sort_keys=True).encode()
