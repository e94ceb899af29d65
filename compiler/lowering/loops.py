"""Emit one fused LoopGroup as an inline loop nest (see compiler.passes.fusion)."""

import numpy as np

from ..ir import pad_shape as _pad
from ..registry import REGISTRY
from .rules import RULES, combine_code, is_reduction, reduce_identity


def materialized(g, users, outputs) -> set:
    """Ids of the group's nodes that need an array (not only a scalar in the loop): graph
    outputs, values read outside the group or by a later phase (unless computed once per
    row), and buffer reductions. Shared by the Numba and LLVM emitters."""
    out = set()
    for node in g.nodes:
        nid = id(node)
        if nid in outputs:
            out.add(nid)
            continue
        for user in users.get(nid, []):
            if not g.holds(user):
                out.add(nid)
            elif nid not in g.row_level and g.phase[id(user)] > g.phase[nid]:
                out.add(nid)  # a full value read back in a later phase
    if g.buffer_reductions:
        out.update(id(n) for n in g.nodes if is_reduction(n))
    return out


def phase_members(g, phase) -> tuple:
    """(full-domain nodes, row reductions, other row-level nodes) of one phase, in order."""
    members = [n for n in g.nodes if g.phase[id(n)] == phase]
    full = [n for n in members if id(n) not in g.row_level]
    reds = [n for n in members if id(n) in g.row_level and is_reduction(n)]
    rows = [n for n in members if id(n) in g.row_level and not is_reduction(n)]
    return full, reds, rows


class _Group:
    """Per-group codegen state."""

    def __init__(self, em, group, units_of):
        self.em, self.g, self.units_of = em, group, units_of
        self.ctx = em.ctx
        self.domain = group.domain
        self.rank = len(group.domain)
        self.materialized = materialized(group, em.users, em.outputs)
        self.gid = self.ctx.group_id(group)
        self.dims = [f"d{self.gid}_{j}" for j in range(self.rank)]

    # -- planning -----------------------------------------------------------------------

    def _externals(self):
        seen = []
        for node in self.g.nodes:
            for inp in node.inputs:
                if not self.g.holds(inp) and inp.op != "const" and inp not in seen:
                    seen.append(inp)
        return seen

    # -- sizes and indexing ---------------------------------------------------------------

    def emit_sizes(self):
        full_inputs = [i for i in self._externals()]
        for j in range(self.rank):
            expr = None
            for inp in full_inputs:
                shape = _pad(inp.shape)
                off = self.rank - len(shape)
                jj = j - off
                if jj >= 0 and (shape[jj] != 1 or self.domain[j] == 1) and \
                        shape[jj] == self.domain[j]:
                    expr = f"{self.em.array_of(inp)}.shape[{jj}]"
                    break
            if expr is None:
                expr = str(self.domain[j])
                if self.domain[j] != 1:
                    self.ctx.shape_generic = False
            self.em.emit(f"{self.dims[j]} = {expr}")

    def index(self, shape, idx, domain=None) -> str:
        domain = self.domain if domain is None else domain
        shape = _pad(shape)
        off = len(domain) - len(shape)
        parts = []
        for j, size in enumerate(shape):
            parts.append("0" if size == 1 and domain[j + off] != 1 else idx[j + off])
        return ", ".join(parts)

    def _squeezed_row(self, node) -> bool:
        g = self.g
        return g.inner > 0 and id(node) in g.row_level and len(node.shape) == g.outer

    def row_shape_expr(self, node) -> str:
        if not len(node.shape):
            return "(1,)"  # a 0-d value travels as a 1-element 1-d array (see array_of)
        outer = self.dims[:self.g.outer]
        if len(node.shape) == len(self.domain):
            dims = outer + ["1"] * (self.rank - self.g.outer)
        else:
            dims = outer
        dims = dims or ["1"]
        return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"

    def shape_expr_full(self) -> str:
        return "(" + ", ".join(self.dims) + ("," if self.rank == 1 else "") + ")"

    # -- operands -----------------------------------------------------------------------------

    def operand(self, inp, user, idx) -> str:
        """The expression for input `inp` of `user` at loop indices `idx`."""
        if inp.op == "const" and np.ndim(inp.attrs["value"]) == 0:
            return self.ctx.const(inp.attrs["value"], inp.dtype)
        if self.g.holds(inp):
            reread = id(inp) not in self.g.row_level and \
                self.g.phase[id(inp)] < self.g.phase[id(user)]
            if not reread:
                return self.ctx.scalar(inp)
        arr = self.em.array_of(inp)
        if self._squeezed_row(user) and self.g.outer and not is_reduction(user):
            # a row value without the reduced dims: its inputs align with the outer dims
            # (a reduction reads its input over the whole domain, even when keepdim=False)
            outer = self.g.outer
            return f"{arr}[{self.index(inp.shape, idx[:outer], self.domain[:outer])}]"
        return f"{arr}[{self.index(inp.shape, idx)}]"

    def expr(self, node, idx) -> str:
        args = [self.operand(i, node, idx) for i in node.inputs]
        return RULES[node.op](args, node, self.ctx)

    # -- emission -------------------------------------------------------------------------

    def allocate(self):
        for node in self.g.nodes:
            if id(node) not in self.materialized:
                continue
            var, dt = self.ctx.var(node), f"np.{node.dtype.name}"
            if is_reduction(node) and self.g.buffer_reductions:
                shape = self._buffer_shape(node)
                init = self.ctx.const(reduce_identity(node, node.dtype), node.dtype)
                self.em.emit(f"{var} = np.full({shape}, {init}, {dt})")
            elif id(node) in self.g.row_level:
                self._alloc(node, var, self.row_shape_expr(node))
            else:
                self._alloc(node, var, self.shape_expr_full())

    def _alloc(self, node, var, shape):
        planner = self.em.planner
        if planner is None:
            self.em.emit(f"{var} = np.empty({shape}, np.{node.dtype.name})")
        else:
            self.em.emit(planner.allocate(node, var, shape, node.dtype.name))

    def _reduced(self, node, per_dim, reduced_value) -> list:
        """One entry per dim of a buffer reduction's result: per_dim(domain dim) for the
        dims kept, `reduced_value` for reduced dims when keepdim (dropped otherwise)."""
        dims, keep = node.attrs["dims"], node.attrs["keepdim"]
        src_rank = len(node.inputs[0].shape)
        off = self.rank - src_rank
        return [reduced_value if j in dims else per_dim(j + off)
                for j in range(src_rank) if keep or j not in dims]

    def _buffer_shape(self, node) -> str:
        parts = self._reduced(node, lambda j: self.dims[j], "1") or ["1"]
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

    def _buffer_index(self, node, idx) -> str:
        return ", ".join(self._reduced(node, lambda j: idx[j], "0") or ["0"])

    def emit_full(self, node, idx, depth):
        em, s = self.em, self.ctx.scalar(node)
        if is_reduction(node) and self.g.buffer_reductions:
            var = self.ctx.var(node)
            at = f"{var}[{self._buffer_index(node, idx)}]"
            value = self.operand(node.inputs[0], node, idx)
            em.emit(f"{s}_v = {value}", depth)
            em.emit(f"{at} = " + combine_code(node).format(acc=at, v=f"{s}_v"), depth)
            return
        em.emit(f"{s} = {self.expr(node, idx)}", depth)
        if id(node) in self.materialized:
            em.emit(f"{self.ctx.var(node)}[{self.index(node.shape, idx)}] = {s}", depth)

    def emit_row_node(self, node, row_idx, depth):
        em, s = self.em, self.ctx.scalar(node)
        if is_reduction(node):
            acc = f"r{self.ctx.index[id(node)]}"
            em.emit(f"{s} = np.{node.dtype.name}({acc})" if wide_sum(node) else f"{s} = {acc}",
                    depth)
        else:
            em.emit(f"{s} = {self.expr(node, row_idx)}", depth)
        if id(node) in self.materialized:
            em.emit(f"{self.ctx.var(node)}[{self._row_store_index(node)}] = {s}", depth)

    def _row_store_index(self, node) -> str:
        if not len(node.shape):
            return "0"
        outer = [f"i{j}" for j in range(self.g.outer)]
        if len(node.shape) == len(self.domain):
            parts = outer + ["0"] * (self.rank - self.g.outer)
        else:
            parts = outer
        return ", ".join(parts or ["0"])

    def emit(self):
        g, em = self.g, self.em
        em.emit(f"# kernel {self.gid}: {', '.join(n.op for n in g.nodes)}")
        self.emit_sizes()
        self.allocate()
        idx = [f"i{j}" for j in range(self.rank)]
        depth = 1
        parallel = self._parallel()
        for j in range(g.outer):
            loop = "prange" if parallel and j == 0 else "range"
            em.emit(f"for i{j} in {loop}({self.dims[j]}):", depth)
            depth += 1
        row_idx = idx[:g.outer] + ["0"] * g.inner
        for phase in sorted(set(g.phase.values())):
            self._emit_phase(phase, idx, row_idx, depth)

    def _parallel(self) -> bool:
        """Split the outermost loop across threads: big domains whose iterations write
        disjoint outputs (not buffer reductions, which accumulate across iterations)."""
        g = self.g
        if not self.ctx.parallel or not g.outer or g.buffer_reductions:
            return False
        if int(np.prod(self.domain)) < self.ctx.parallel_threshold:
            return False
        self.ctx.uses_prange = True
        return True

    def _emit_phase(self, phase, idx, row_idx, depth):
        g, em = self.g, self.em
        full, reds, rows = phase_members(g, phase)
        for red in reds:
            acc_dtype = np.dtype(np.float64) if wide_sum(red) else red.dtype
            init = self.ctx.const(reduce_identity(red, acc_dtype), acc_dtype)
            em.emit(f"r{self.ctx.index[id(red)]} = {init}", depth)
        inner_depth = depth
        if full or reds:
            for j in range(g.outer, self.rank):
                em.emit(f"for i{j} in range({self.dims[j]}):", inner_depth)
                inner_depth += 1
            for node in full:
                self.emit_full(node, idx, inner_depth)
            for red in reds:
                r = f"r{self.ctx.index[id(red)]}"
                value = self.operand(red.inputs[0], red, idx)
                em.emit(f"{r} = " + combine_code(red).format(acc=r, v=value), inner_depth)
        for node in reds + rows:
            self.emit_row_node(node, row_idx, depth)


def wide_sum(node) -> bool:
    """float32 row sums accumulate in float64: a long sequential float32 sum loses digits
    (NumPy sums pairwise); the result is rounded back to float32 once."""
    return REGISTRY[node.op].combine == "add" and node.dtype == np.float32


def emit_group(em, group, units_of):
    """Append the loop nest for `group` to the entry being generated."""
    _Group(em, group, units_of).emit()
