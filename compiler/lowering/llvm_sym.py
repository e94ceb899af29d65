"""Kernels for symbolic lengths in the llvm backend: one machine-code kernel for every
length of the loops of a trace (hybridnet.jit.dynamic, hybridnet.jit.generalize).

The llvm emitter writes sizes as literals. A function whose loops were traced at three
lengths n1, n2, n3 of one dim (the symbolic length n) gives three optimized graphs; one
kernel serves every n when:

1. The graphs are the same but for sizes (`Bounds.walk`): the same nodes and ops, every
   attribute equal (`_same_attrs`: a constant the Python code computed from the length,
   `n ** -0.5` or `float(n % 7)` at lengths where it is no affine function, is refused)
   except what follows from a size: a slice bound fixed from its dim's start or end with
   step 1 (`x[1:]`, `x[-3:]`), the one size of a reshape or expand that follows the
   length (a reshape's -1), a loop's trip count, and a 0-d float constant that is a count
   the graph witnesses (`_count`: a whole number affine in the length that a sum beside it
   reduces, as a mean divides by, or exactly its reciprocal, as the mean's gradient
   multiplies by). Every node's shape is then one
   affine function `a*n + b` of the length through all three points (at most one dim of
   a node follows it). Traces whose views Python
   bounded from sizes that differ between them (a clamped slice, `x[:20]` of 10 and 11
   rows; split and chunk pieces) never get here (TraceGraph.clamps).
2. Lowered at each length with no choice that depends on a size (no row split across
   threads; the temporaries whose size changes share no bytes and come last in the arena;
   llvm_loop's carried buffers alternate counted from the last step), the three IR texts
   are the same but for i64/i32 literals, each an integer affine function of the length
   through all three points (a loop's trip count, a step picked from the end, a matrix's
   row count), and float literals that are such counts (converted with sitofp) or their
   reciprocals (1 / that: IEEE division is correctly rounded, so the kernel divides to
   the bits the trace's constant folding gave). `parametrize` makes each a value
   computed at the top of its function from n, which every part loads from the buffer
   table (slot `n_bufs`, after the temporaries). Anything else (a literal in a loop
   body's function, a type's size) raises SymbolicError, and numba's size-generic code
   is tried instead.

Three points, not two: a size that is not affine in the length (`n // 2`, `n * n`)
cannot agree with one affine function at three lengths. The bounds (`Bounds`: every size
at least 1, every slice inside its input, every loop with a step, its picked steps inside
it) give the least length `min_n` (and a largest, where a BLAS size would overflow i32);
calls outside them run eagerly.

Shapes, temporaries and outputs of the program are `Affine` where they change; the
runtime (runtime.llvm_kernel.SymKernel) evaluates them for each call's n, which it reads
from the input `sym` names, and checks every input against them.
"""

import math
import re
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import LoweringError
from ..loop import is_loop, traced_trip
from ..passes.cse import attr_key
from ..registry import REGISTRY, Trait
from .llvm_arena import rounded
from .llvm_program import LLProgram


class SymbolicError(LoweringError):
    """The traces do not lower to one kernel for every length."""


@dataclass(frozen=True)
class Affine:
    """A size `a * n + b` of the symbolic length n."""

    a: int
    b: int

    def at(self, n: int) -> int:
        return self.a * n + self.b

    def __repr__(self) -> str:
        return f"{self.a}*n{self.b:+d}" if self.a != 1 else f"n{self.b:+d}"


def at(size, n: int) -> int:
    """`size` (an int or an Affine) at length n."""
    return size.at(n) if isinstance(size, Affine) else size


def shape_at(shape, n: int) -> tuple:
    return tuple(at(s, n) for s in shape)


def fit(values, ns):
    """The int every value equals, else the Affine through every (n, value), else None."""
    values = [int(v) for v in values]
    if all(v == values[0] for v in values):
        return values[0]
    (n0, v0), (n1, v1) = (ns[0], values[0]), (ns[1], values[1])
    if n0 == n1 or (v1 - v0) % (n1 - n0):
        return None
    a = (v1 - v0) // (n1 - n0)
    b = v0 - a * n0
    return Affine(a, b) if all(a * n + b == v for n, v in zip(ns, values)) else None


def _fit_shape(shapes, ns, what):
    if len({len(s) for s in shapes}) != 1:
        raise SymbolicError(f"{what}: rank differs between lengths")
    out = []
    for sizes in zip(*shapes):
        f = fit(sizes, ns)
        if f is None:
            raise SymbolicError(f"{what}: size {list(sizes)} is no affine function of the "
                                f"length {list(ns)}")
        out.append(f)
    if sum(isinstance(s, Affine) for s in out) > 1:
        raise SymbolicError(f"{what}: more than one dim follows the length")
    return tuple(out)


# ---- the IR texts ------------------------------------------------------------------------

_TOKEN = re.compile(r'''
    (?P<name>[%@!]"(?:[^"\\]|\\.)*"|[%@!][-\w.$]+)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<hex>0x[0-9A-Fa-f]+)
  | (?P<num>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<word>[A-Za-z_][\w.]*)
  | (?P<space>\s+)
  | (?P<other>.)''', re.VERBOSE)
_INT = re.compile(r"-?\d+$")
_DEFINE = re.compile(r'define [^@]*@("[^"]+"|[-\w.$]+)\(i8\*\* (%"[^"]*"|%[-\w.$]+)')
_BODY_FN = re.compile(r'_b\d+_')  # (a loop body's functions get another buffer table)
_TYPES = {"i64": 64, "i32": 32}
_FLOATS = ("float", "double")  # (a count as a float literal: computed as sitofp of n's)
_INVERSE = ".inverse"  # (its reciprocal: computed as 1 / that)


def _tokens(line) -> list:
    return [(m.lastgroup, m.group()) for m in _TOKEN.finditer(line)]


def _literals(column, ty):
    """The integers a column of literals (one per length) stands for: integer literals
    of i64 or i32, or float literals that are whole numbers (exactly, below 2**24); else
    None."""
    if ty in ("i64", "i32") and all(kind == "num" and _INT.match(t) for kind, t in column):
        return [int(t) for _, t in column]
    if ty in _FLOATS:
        return _whole([_float(kind, t) for kind, t in column])
    return None


def _whole(values):
    """Whole numbers below 2**24 (exact in float32) as ints, else None (also for -0.0,
    which sitofp would not give back)."""
    if all(v is not None and v.is_integer() and abs(v) < 2 ** 24 and
           not (v == 0 and struct.pack(">d", v)[0] & 0x80) for v in values):
        return [int(v) for v in values]
    return None


def _reciprocals(values, ty):
    """The counts c with values 1/c exactly as the type divides (a mean's gradient), else
    None."""
    real = np.float32 if ty == "float" else np.float64
    counts = []
    for v in values:
        if v is None or not v or not np.isfinite(v):
            return None
        c = round(1.0 / v)
        if not 0 < c < 2 ** 24 or real(1) / real(c) != real(v):
            return None
        counts.append(c)
    return counts


def _float(kind, text):
    """The value of an LLVM float literal (hex: a double's bits), else None."""
    if kind == "hex" and len(text) == 18:
        return struct.unpack(">d", int(text, 16).to_bytes(8, "big"))[0]
    if kind == "num":
        return float(text)
    return None


def _int_type(tokens, j):
    """The integer type of the literal at token j: the nearest word before it on its line
    (`add i64 %x, 5`, `store i32 7, ...`), if that is i64 or i32."""
    for kind, text in reversed(tokens[:j]):
        if kind == "word":
            return text if text in _TYPES or text in _FLOATS else None
    return None


@dataclass
class _Function:
    name: str
    table: str  # its first parameter: the buffer table
    entry: int  # the line of its "entry:" label
    values: dict  # (a, b, type) -> the name of the value computed at its top


def parametrize(texts, ns, n_slot) -> tuple:
    """(IR, largest n) from `texts` (one module lowered at each length of `ns`): every
    literal that follows the length computed from n (see the module docstring); above
    the largest n an i32 literal (a BLAS size) would overflow."""
    lines = [t.split("\n") for t in texts]
    if len({len(x) for x in lines}) != 1:
        raise SymbolicError("the code differs between lengths (not only in sizes)")
    out, fns, fn = list(lines[0]), [], None
    for i, row in enumerate(zip(*lines)):
        first = row[0]
        if first.startswith("define "):
            m = _DEFINE.match(first)
            fn = _Function(m.group(1), m.group(2), -1, {}) if m else None
            if fn is not None:
                fns.append(fn)
        elif fn is not None and fn.entry < 0 and first == "entry:":
            fn.entry = i
        elif first == "}":
            fn = None
        if any(r != first for r in row[1:]):
            out[i] = _line(row, ns, fn)
    largest = None
    for fn in reversed([f for f in fns if f.values]):
        out[fn.entry + 1:fn.entry + 1] = _prologue(fn, n_slot)
        for a, b, ty in fn.values:
            if ty == "i32":
                top = (2 ** 31 - 1 - b) // a if a > 0 else None
                largest = top if largest is None or (top is not None and top < largest) \
                    else largest
    return "\n".join(out), largest


def _line(row, ns, fn) -> str:
    toks = [_tokens(r) for r in row]
    if len({len(t) for t in toks}) != 1:
        raise SymbolicError(f"the code differs between lengths: {row[0].strip()[:80]!r}")
    parts = []
    for j, column in enumerate(zip(*toks)):
        kind, text = column[0]
        if all(c == column[0] for c in column[1:]):
            parts.append(text)
            continue
        ty = _int_type(toks[0], j)
        values = _literals(column, ty)
        if values is None and ty in _FLOATS:
            values = _reciprocals([_float(k, t) for k, t in column], ty)
            ty = ty + _INVERSE if values is not None else ty
        if values is None or fn is None or fn.entry < 0 or _BODY_FN.search(fn.name):
            raise SymbolicError("the code differs between lengths beyond its sizes: "
                                f"{row[0].strip()[:80]!r}")
        f = fit(values, ns)
        if not isinstance(f, Affine):
            raise SymbolicError(f"a literal is no affine function of the length: "
                                f"{[c[1] for c in column]} at {list(ns)}")
        key = (f.a, f.b, ty)
        name = fn.values.setdefault(key, f'%"hn.s{len(fn.values)}"')
        parts.append(name)
    return "".join(parts)


def _prologue(fn, n_slot) -> list:
    """The lines computing n and each literal's value at the top of `fn`."""
    rows = [f'  %"hn.np" = getelementptr i8*, i8** {fn.table}, i64 {n_slot}',
            '  %"hn.nv" = load i8*, i8** %"hn.np"',
            '  %"hn.n" = ptrtoint i8* %"hn.nv" to i64']
    for (a, b, ty), name in fn.values.items():
        wide = name[:-1] + '.w"' if ty != "i64" else name
        rows.append(f'  {name[:-1]}.m" = mul i64 %"hn.n", {a}')
        rows.append(f'  {wide} = add i64 {name[:-1]}.m", {b}')
        if ty == "i32":
            rows.append(f"  {name} = trunc i64 {wide} to {ty}")
        elif ty in _FLOATS:
            rows.append(f"  {name} = sitofp i64 {wide} to {ty}")
        elif ty.endswith(_INVERSE):
            real = ty[:-len(_INVERSE)]
            rows.append(f'  {name[:-1]}.f" = sitofp i64 {wide} to {real}')
            rows.append(f'  {name} = fdiv {real} 1.000000e+00, {name[:-1]}.f"')
    return rows


# ---- the program -------------------------------------------------------------------------


def varying_temps(firsts) -> set:
    """The temporaries whose size differs between the first passes (llvm_emit.first_pass)
    of the lengths; raises when the passes do not have the same temporaries."""
    ks = [k for _, _, k in firsts]
    if len({len(k.temps) for k in ks}) != 1 or any(k.lives != ks[0].lives for k in ks):
        raise SymbolicError("the temporaries differ between lengths")
    return {j for j, sizes in enumerate(zip(*(k.temps for k in ks)))
            if len(set(sizes)) > 1}


def symbolic_program(programs, ns, apart, bounds) -> LLProgram:
    """One LLProgram for every length from `programs` (llvm_emit.lower_llvm of one graph
    traced at each length of `ns`, with `apart` the temporaries whose size varies and
    call=False); `bounds`: a Bounds of the graphs."""
    p0 = programs[0]
    _same_interface(programs)
    inputs = [(_fit_shape([p.inputs[i][0] for p in programs], ns, f"input {i}"), d)
              for i, (_, d) in enumerate(p0.inputs)]
    outputs = [(_fit_shape([p.outputs[i][0] for p in programs], ns, f"output {i}"), d)
               for i, (_, d) in enumerate(p0.outputs)]
    temps = [fit([p.temps[j] for p in programs], ns) for j in range(len(p0.temps))]
    if any(t is None for t in temps) or \
            {j for j, t in enumerate(temps) if isinstance(t, Affine)} != set(apart):
        raise SymbolicError("a temporary's size is no affine function of the length")
    fixed = [j for j in range(len(temps)) if j not in apart]
    if any([p.temp_offsets[j] for j in fixed] != [p0.temp_offsets[j] for j in fixed]
           for p in programs):
        raise SymbolicError("the arena plan differs between lengths")
    sym = _sym_input(inputs)
    n_slot = len(p0.inputs) + len(p0.consts) + len(p0.outputs) + len(p0.temps)
    text, largest = parametrize([p.source for p in programs], ns, n_slot)
    out = LLProgram(text, inputs, p0.consts, outputs, temps, list(p0.fns), p0.units)
    for flag in ("uses_blas", "single_output", "same_as", "status", "large_products"):
        setattr(out, flag, getattr(p0, flag))
    out.temp_offsets = list(p0.temp_offsets)
    out.arena = max((p0.temp_offsets[j] + rounded(p0.temps[j]) for j in fixed), default=0)
    out.sym, out.apart, out.may_exit = sym, sorted(apart), True
    for t in temps:
        bounds.at_least(t, 1)
    if largest is not None:
        bounds.most = largest if bounds.most is None else min(bounds.most, largest)
    if bounds.most is not None and bounds.most < max(ns):
        raise SymbolicError("the traced lengths lie outside the kernel's bounds")
    out.min_n, out.max_n = bounds.least, bounds.most
    out.notes = [f"llvm: one kernel for every length n (traced at {sorted(ns)}; the input "
                 f"{sym[0]}'s dim {sym[1]} is {sym[2]!r}), n >= {out.min_n}"] + \
        list(p0.notes)
    out.finish()
    return out


def _same_interface(programs):
    p0 = programs[0]
    for p in programs[1:]:
        if [d for _, d in p.inputs] != [d for _, d in p0.inputs] or \
                [d for _, d in p.outputs] != [d for _, d in p0.outputs] or \
                p.fns != p0.fns or p.same_as != p0.same_as or p.status != p0.status or \
                len(p.temps) != len(p0.temps) or len(p.consts) != len(p0.consts) or \
                any(a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes()
                    for a, b in zip(p.consts, p0.consts)) or p.split_rows or p0.split_rows:
            raise SymbolicError("the kernels' interfaces differ between lengths")


def _sym_input(inputs) -> tuple:
    """(input index, dim, Affine) the runtime reads n from: the first input with a size
    that follows the length (a = 1 preferred)."""
    found = [(i, d, s) for i, (shape, _) in enumerate(inputs)
             for d, s in enumerate(shape) if isinstance(s, Affine)]
    if not found:
        raise SymbolicError("no input of the kernel has the symbolic length")
    return min(found, key=lambda f: (abs(f[2].a) != 1, f[0]))


class Bounds:
    """The lengths n at which a kernel traced at other lengths computes what eager would:
    every size at least 1, every slice inside its input, every loop with a step and its
    picked steps inside it (the numba backend checks these in its kernels)."""

    def __init__(self):
        self.least, self.most = 1, None

    def at_least(self, value, floor):
        """value(n) >= floor, for value an int or an Affine."""
        a, b = (value.a, value.b) if isinstance(value, Affine) else (0, int(value))
        if a > 0:
            self.least = max(self.least, -(-(floor - b) // a))
        elif a < 0:
            top = (b - floor) // -a
            self.most = top if self.most is None else min(self.most, top)

    def walk(self, graphs, ns):
        """Add the bounds of one graph traced at each length of `ns` (the same nodes)."""
        if len({len(g.nodes) for g in graphs}) != 1:
            raise SymbolicError("the graphs differ between lengths")
        made = []

        def users():  # (each graph's users, made when a constant differs)
            if not made:
                made.extend(g.users() for g in graphs)
            return made
        for nodes in zip(*(g.nodes for g in graphs)):
            if len({n.op for n in nodes}) != 1:
                raise SymbolicError("the graphs differ between lengths")
            shape = _fit_shape([tuple(n.shape) for n in nodes], ns, nodes[0].op)
            for size in shape:
                self.at_least(size, 1)
            _same_attrs(nodes, ns, users)
            if REGISTRY[nodes[0].op].window in ("read", "write"):
                self._slice(nodes, ns)
            elif is_loop(nodes[0]):
                self._loop(nodes, ns)

    def _slice(self, nodes, ns):
        """A slice's bounds (or those of the window a pad_slice writes): each the same at
        every length, or the same distance from its dim's end (`x[-3:]`, `x[1:]`), with
        step 1 along a dim that follows the length (`x[::4]` has ceil(n / 4) rows: no
        affine function)."""
        wholes = [tuple(n.inputs[0].shape if REGISTRY[n.op].window == "read" else n.shape)
                  for n in nodes]
        src = _fit_shape(wholes, ns, nodes[0].op)
        for d, size in enumerate(src):
            index = [n.attrs["index"][d] for n in nodes]
            sizes = [w[d] for w in wholes]
            if len({c for _, _, c in index}) != 1 or \
                    isinstance(size, Affine) and index[0][2] != 1:
                raise SymbolicError("a strided slice along a dim that follows the length")
            for j in (0, 1):
                bounds = [ix[j] for ix in index]
                if len(set(bounds)) > 1 and len({n - b for n, b in zip(sizes, bounds)}) > 1:
                    raise SymbolicError("a slice bound neither fixed nor fixed from the end "
                                        f"({bounds} of sizes {sizes})")
            start = _need([ix[0] for ix in index], ns)
            stop = _need([ix[1] for ix in index], ns)
            self.at_least(start, 0)
            self.at_least(_minus(size, stop), 0)

    def _loop(self, nodes, ns):
        trip = _need([traced_trip(n) for n in nodes], ns)
        self.at_least(trip, 1)
        for j in range(len(nodes[0].attrs["spec"].picks)):
            at = _need([n.attrs["spec"].picks[j].at(traced_trip(n)) for n in nodes], ns)
            self.at_least(at, 0)
            self.at_least(_minus(_minus(trip, 1), at), 0)


def _same_attrs(nodes, ns, users=None):
    """Attributes are the same at every length, but for what follows from a size: a
    slice's bounds (Bounds._slice, a pad_slice's too) and the one size of a target shape
    that follows the length (a reshape's -1, an expand's, a pad_slice's). Anything else
    that differs, a constant the Python code computed from the length (`float(n % 7)`,
    a mean's count), is a value the kernel could not compute from n: such traces get a
    kernel per length, or numba's if its code is the same."""
    op = nodes[0].op
    keys = [{k: attr_key(v) for k, v in n.attrs.items()} for n in nodes]
    for name, first in keys[0].items():
        values = [k.get(name) for k in keys]
        if all(v == first for v in values) or \
                REGISTRY[op].window is not None and name == "index" or \
                op == "const" and name == "value" and users is not None and \
                _count(nodes, ns, users()) is not None:
            continue
        # (a target shape: a reshape's, an expand's, the zeros a pad_slice writes into)
        shapes = [tuple(n.attrs[name]) for n in nodes] if name == "shape" else ()
        if name == "shape" and len({len(v) for v in shapes}) == 1 and \
                sum(len(set(dim)) > 1 for dim in zip(*shapes)) == 1:
            continue
        raise SymbolicError(f"{op}: its {name} differs between lengths (a value computed "
                            "from the length, not a size)")
    if any(k.keys() != keys[0].keys() for k in keys[1:]):
        raise SymbolicError(f"{op}: its attributes differ between lengths")


def _count(nodes, ns, users):
    """The Affine a 0-d float constant follows at every length when it is a count of its
    graph, else None: a whole number c beside a sum whose reduced dims hold c (+ 1: var's
    correction) elements at every length (a mean's count), or whose quotient is broadcast
    into c (+ 1) elements or c (+ 1) copies (a mean over the steps' gradient), or exactly
    1 / c where the value it multiplies holds c (+ 1) elements (the mean's gradient,
    folded).
    Lowered as the integer converted, or 1 / it (see `_line`). A float Python computed
    from the length otherwise (`min(n, 8)`, `n % 7` where it happens to look affine) has
    no such witness, and keeps a kernel per length."""
    values = [n.attrs["value"] for n in nodes]
    if nodes[0].shape or nodes[0].dtype.kind != "f" or \
            not all(isinstance(v, (int, float)) for v in values):
        return None
    ty = "float" if nodes[0].dtype.itemsize == 4 else "double"
    floats = [float(v) for v in values]
    whole = _whole(floats)
    counts = whole or _reciprocals(floats, ty)
    f = counts and fit(counts, ns)
    if not isinstance(f, Affine):
        return None
    seen = [_witnessed(n, u, c, whole is None) for n, u, c in zip(nodes, users, counts)]
    return f if set.intersection(*seen) else None


def _witnessed(const, users, c, inverse) -> set:
    """The k in {0, 1} with c + k the element count next to `const` (see `_count`): the
    dims a sum beside it reduces, what it (1 / c) multiplies, or what the value it makes
    is broadcast into (a backward's g / c, expanded over the mean's input)."""
    found = set()
    for user in users.get(id(const), ()):
        sizes = [math.prod([r.inputs[0].shape[d] for d in r.attrs["dims"]])
                 for r in user.inputs if _is_sum(r)]
        for b in _moved(user, users):  # (its elements, and the copies it makes: a
            if REGISTRY[b.op].has(Trait.BROADCAST):  # mean(0)'s g / n expanded n times)
                size = math.prod(b.shape)
                sizes += [size, size // max(1, math.prod(b.inputs[0].shape))]
        if inverse:
            sizes.append(math.prod(user.shape))
        found.update(size - c for size in sizes if size - c in (0, 1))
    return found


def _moved(node, users, hops=3) -> list:
    """The movements (reshape, expand...) that read `node`, and those reading them."""
    out, frontier = [], [node]
    for _ in range(hops):
        frontier = [u for n in frontier for u in users.get(id(n), ())
                    if REGISTRY[u.op].has(Trait.MOVEMENT)]
        out += frontier
    return out


def _is_sum(node) -> bool:
    opdef = REGISTRY[node.op]
    return opdef.has(Trait.REDUCTION) and opdef.combine == "add" and \
        node.attrs.get("dims") is not None


def _need(values, ns):
    f = fit(values, ns)
    if f is None:
        raise SymbolicError(f"{list(values)} is no affine function of the length {list(ns)}")
    return f


def _minus(x, y):
    """x - y for ints and Affines."""
    xa, xb = (x.a, x.b) if isinstance(x, Affine) else (0, x)
    ya, yb = (y.a, y.b) if isinstance(y, Affine) else (0, y)
    return Affine(xa - ya, xb - yb) if xa != ya else xb - yb


def evaluate_layout(program, n):
    """(input shapes, output shapes, temporary offsets, arena bytes) at length n."""
    ins = [(shape_at(s, n), d) for s, d in program.inputs]
    outs = [(shape_at(s, n), d) for s, d in program.outputs]
    offsets, end = list(program.temp_offsets), program.arena
    for j in program.apart:
        offsets[j] = end
        end += rounded(at(program.temps[j], n))
    return ins, outs, offsets, end





def lower_symbolic(graphs, ns) -> LLProgram:
    """One program for every length from `graphs` (one optimized graph traced at each
    length of `ns`, at least three); raises SymbolicError (a LoweringError) when they do
    not make one."""
    from .llvm_emit import first_pass, lower_llvm
    if len(set(ns)) < 3 or len(graphs) != len(ns):
        raise SymbolicError("a kernel for every length needs traces at three lengths")
    bounds = Bounds()
    bounds.walk(graphs, ns)
    firsts = [first_pass(g, parallel=False) for g in graphs]
    apart = varying_temps(firsts)
    programs = [lower_llvm(g, first=f, apart=apart, call=False)
                for g, f in zip(graphs, firsts)]
    return symbolic_program(programs, ns, apart, bounds)


__all__ = ["Affine", "Bounds", "SymbolicError", "fit", "parametrize", "symbolic_program",
           "lower_symbolic", "varying_temps", "evaluate_layout", "at", "shape_at"]
