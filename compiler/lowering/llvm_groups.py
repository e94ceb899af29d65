"""Emit one fused LoopGroup as an LLVM IR loop nest (the llvm backend's compiler.lowering
.loops). The group's plan is the one the Numba emitter renders (`loops.materialized`,
`loops.phase_members`, the same operand indexing); sizes are the traced ones (the llvm
backend compiles exact shapes), so every bound and stride is a constant LLVM can fold.
"""

import numpy as np

from ..errors import LoweringError
from ..ir import pad_shape as _pad
from . import llvm_scalar as S
from .loops import materialized, phase_members, wide_sum
from .rules import is_reduction, reduce_identity

_WIDE = np.dtype(np.float64)


class LLGroup:
    """Codegen state of one group inside the kernel function (`em`: llvm_emit._Kernel)."""

    def __init__(self, em, group):
        self.em, self.g, self.b = em, group, em.b
        self.domain = tuple(group.domain)
        self.rank = len(self.domain)
        self.materialized = materialized(group, em.users, em.outputs)
        self.scalars = {}

    # -- operands ------------------------------------------------------------------------

    def _index(self, shape, idx, domain):
        """Per dim of padded `shape`: the loop index reading it (None: broadcast, 0)."""
        shape = _pad(shape)
        off = len(domain) - len(shape)
        return [None if size == 1 and domain[j + off] != 1 else idx[j + off]
                for j, size in enumerate(shape)]

    def _squeezed_row(self, node) -> bool:
        g = self.g
        return g.inner > 0 and id(node) in g.row_level and len(node.shape) == g.outer

    def operand(self, inp, user, idx):
        """The register value of input `inp` of `user` at loop indices `idx`."""
        if inp.op == "const" and np.ndim(inp.attrs["value"]) == 0:
            return S.constant(inp.attrs["value"], inp.dtype)
        g = self.g
        if g.holds(inp):
            reread = id(inp) not in g.row_level and g.phase[id(inp)] < g.phase[id(user)]
            if not reread:
                return self.scalars[id(inp)]
        if self._squeezed_row(user) and g.outer and not is_reduction(user):
            at = self._index(inp.shape, idx[:g.outer], self.domain[:g.outer])
        else:
            at = self._index(inp.shape, idx, self.domain)
        return self.em.load(self.em.buffer(inp), at)

    def expr(self, node, idx):
        want = S.compute_dtypes(node)
        args = [S.convert(self.b, self.operand(i, node, idx), i.dtype, d)
                for i, d in zip(node.inputs, want)]
        rule = S.RULES.get(node.op)
        if rule is None:
            raise LoweringError(f"the llvm backend cannot lower op {node.op!r} yet")
        value = rule(self.b, args, node, self.em)
        if node.op == "cast":
            value = S.convert(self.b, value, node.inputs[0].dtype, node.dtype)
        return value

    # -- buffers -----------------------------------------------------------------------------

    def allocate(self):
        for node in self.g.nodes:
            if id(node) not in self.materialized:
                continue
            if id(node) not in self.g.row_level and not is_reduction(node):
                if (1,) * (self.rank - len(_pad(node.shape))) + _pad(node.shape) != self.domain:
                    raise LoweringError(f"{node.op}: a fused value of shape {node.shape} in a "
                                        f"loop over {list(self.domain)}")
            buf = self.em.new_buffer(node)
            if is_reduction(node) and self.g.buffer_reductions:
                self.em.fill(buf, S.constant(reduce_identity(node, node.dtype), node.dtype))

    def _row_at(self, node, row_idx):
        if not len(node.shape):
            return [None]
        outer = row_idx[:self.g.outer]
        if len(node.shape) == self.rank:
            return outer + [None] * (self.rank - self.g.outer)
        return outer or [None]

    def _buffer_at(self, node, idx):
        dims, keep = node.attrs["dims"], node.attrs["keepdim"]
        src_rank = len(node.inputs[0].shape)
        off = self.rank - src_rank
        at = [None if j in dims else idx[j + off] for j in range(src_rank)
              if keep or j not in dims]
        return at or [None]

    # -- emission ------------------------------------------------------------------------------

    def emit_full(self, node, idx):
        em = self.em
        if is_reduction(node) and self.g.buffer_reductions:
            buf, at = em.buffer(node), self._buffer_at(node, idx)
            v = S.convert(self.b, self.operand(node.inputs[0], node, idx),
                          node.inputs[0].dtype, node.dtype)
            em.store(buf, at, S.combine(self.b, node, em.load(buf, at), v, node.dtype))
            return
        s = self.scalars[id(node)] = self.expr(node, idx)
        if id(node) in self.materialized:
            em.store(em.buffer(node), self._index(node.shape, idx, self.domain), s)

    def emit_row(self, node, row_idx, accs):
        em = self.em
        if is_reduction(node):
            acc, dtype = accs[id(node)]
            s = S.convert(self.b, self.b.load(acc), dtype, node.dtype)
        else:
            s = self.expr(node, row_idx)
        self.scalars[id(node)] = s
        if id(node) in self.materialized:
            em.store(em.buffer(node), self._row_at(node, row_idx), s)

    def emit(self):
        self.allocate()
        self._outer(0, [], self._phases)

    def _outer(self, j, idx, body):
        if j == self.g.outer:
            body(idx)
            return
        if j == 0 and self.em.split:  # (a parallel kernel: this thread's rows)
            lo, hi = self.em.rows()
            with self.em.loop(hi, start=lo) as i:
                self._outer(j + 1, idx + [i], body)
            return
        with self.em.loop(self.domain[j]) as i:
            self._outer(j + 1, idx + [i], body)

    def _phases(self, outer_idx):
        g, b = self.g, self.b
        row_idx = outer_idx + [None] * g.inner
        for phase in sorted(set(g.phase.values())):
            full, reds, rows = phase_members(g, phase)
            accs = {}
            for red in reds:
                dtype = _WIDE if wide_sum(red) else red.dtype
                acc = self.em.alloca(S.ir_type(dtype))
                b.store(S.constant(reduce_identity(red, dtype), dtype), acc)
                accs[id(red)] = (acc, dtype)
            if full or reds:
                self._inner(g.outer, outer_idx, full, reds, accs)
            for node in reds + rows:
                self.emit_row(node, row_idx, accs)

    def _inner(self, j, idx, full, reds, accs):
        if j < self.rank:
            with self.em.loop(self.domain[j]) as i:
                self._inner(j + 1, idx + [i], full, reds, accs)
            return
        for node in full:
            self.emit_full(node, idx)
        for red in reds:
            acc, dtype = accs[id(red)]
            v = S.convert(self.b, self.operand(red.inputs[0], red, idx), red.inputs[0].dtype,
                          dtype)
            self.b.store(S.combine(self.b, red, self.b.load(acc), v, dtype), acc)
