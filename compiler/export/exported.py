"""`ExportedGraph`: a captured graph with its signature (what every export format reads)."""

from dataclasses import dataclass, field

import numpy as np

from ..ir import Graph


@dataclass
class ExportedGraph:
    """A graph and how to call it.

    - `graph`: inputs first the arguments' tensors (in the order of `args_spec`'s leaves),
      then the weights (parameters, buffers, tensors the function captured); its outputs
      are the results' tensors, then one value per guard.
    - `input_names`: one stable name per graph input (`x`, `h.0`, `fc1.weight`).
    - `n_args`: how many inputs are arguments; the rest are weights, whose values are
      `weights[name]` (NumPy arrays).
    - `output_names`: one per graph output: the results (`output`, or `output0`...),
      then the guards' values (`guard0`...).
    - `n_results`: how many outputs are results.
    - `guards`: (output index, kind, expected value): a value the traced code branched on
      (`if x.sum() > 0`); the graph is the path taken when every guard holds.
    - `args_spec` / `result_spec`: the nesting of the arguments and results as plain JSON
      data (`{"t": "tensor"}`, `{"t": "tuple", "items": [...]}`, `{"t": "list", ...}`,
      `{"t": "dict", "keys": [...], "items": [...]}`, `{"t": "const", "value": ...}`).
    - `assumptions`: what else the trace read and took as fixed (Python values, flags).
    """

    graph: Graph
    input_names: list
    n_args: int
    weights: dict
    output_names: list
    n_results: int
    guards: list = field(default_factory=list)
    args_spec: dict = field(default_factory=lambda: {"t": "tuple", "items": []})
    result_spec: dict = field(default_factory=lambda: {"t": "tensor"})
    assumptions: list = field(default_factory=list)
    name: str = "graph"

    @property
    def arg_inputs(self) -> list:
        """The graph inputs that are arguments."""
        return self.graph.inputs[:self.n_args]

    @property
    def weight_inputs(self) -> list:
        """The graph inputs that are weights (values in `weights`)."""
        return self.graph.inputs[self.n_args:]

    def weight_arrays(self) -> list:
        """The weights' arrays, in graph-input order."""
        return [np.asarray(self.weights[n]) for n in self.input_names[self.n_args:]]
