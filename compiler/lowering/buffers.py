"""Buffer planning: reuse the arrays of dead temporaries for new ones.

A temporary dies after the last unit that reads it (or reads a view of it); graph
outputs never die. A new allocation takes a dead buffer of the same rank and dtype
when its shape matches at run time (checked in the generated code, so size-generic
kernels stay correct), else allocates.
"""

from .node_rules import view_root


class BufferPlanner:
    """Tracks which arrays the entry owns, when they die, and hands them out again."""

    def __init__(self, graph, units_of):
        self.units_of = units_of
        self.pool = []  # (var, ndim, dtype name) of dead buffers
        self.owned = {}  # id(root node) -> (var, ndim, dtype name)
        self.reused = 0
        self._roots = {}
        self.last_use = {}
        outputs = {id(self.root(o)) for o in graph.outputs}
        for node in graph.nodes:
            for inp in node.inputs:
                unit = units_of.get(id(node))
                if unit is None:
                    continue
                r = id(self.root(inp))
                self.last_use[r] = max(self.last_use.get(r, -1), unit.index)
        for r in outputs:
            self.last_use[r] = float("inf")

    def fork(self) -> "BufferPlanner":
        """A planner for one kernel of a split program: the same lifetimes, no buffers
        (a kernel reuses only what it allocated itself)."""
        other = object.__new__(BufferPlanner)
        other.units_of, other.last_use, other._roots = self.units_of, self.last_use, self._roots
        other.pool, other.owned, other.reused = [], {}, 0
        return other

    def root(self, node):
        """The node whose buffer `node` views (itself when it owns its data)."""
        found = self._roots.get(id(node))
        if found is None:
            found = view_root(node, lambda n: id(n) in self.units_of and
                              len(self.units_of[id(n)].nodes) == 1)
            self._roots[id(node)] = found
        return found

    def allocate(self, node, var, shape_expr, dtype_name) -> str:
        """The line allocating `var` (reusing a dead buffer when one fits)."""
        ndim = shape_expr.count(",") + (0 if shape_expr.endswith(",)") else 1)
        self.owned[id(node)] = (var, ndim, dtype_name)
        for k, (old, odim, odt) in enumerate(self.pool):
            if odim == ndim and odt == dtype_name:
                del self.pool[k]
                self.reused += 1
                return (f"{var} = {old} if {old}.shape == {shape_expr} else "
                        f"np.empty({shape_expr}, np.{dtype_name})")
        return f"{var} = np.empty({shape_expr}, np.{dtype_name})"

    def adopt(self, node, var, ndim, dtype_name):
        """Own an array the entry got elsewhere (e.g. from np.dot), so it can be reused."""
        self.owned[id(node)] = (var, ndim, dtype_name)

    def release_after(self, unit_index: int):
        """Return buffers whose last reader was unit `unit_index` to the pool."""
        for key, entry in list(self.owned.items()):
            if self.last_use.get(key, -1) <= unit_index:
                self.pool.append(entry)
                del self.owned[key]
