"""Graphs out of Python: the project's JSON format (`graph_file`), ONNX (`onnx_export`),
Graphviz DOT with fusion groups (`compiler.graphviz`). An `ExportedGraph` is a captured
graph with its signature: named inputs (arguments, then weights), named outputs, the
value guards under which it is valid and the structure of the arguments and results."""

from .exported import ExportedGraph

__all__ = ["ExportedGraph"]
