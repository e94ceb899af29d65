"""hybridnet's compiler layer: pure transformations of data.

The op registry (`compiler.ops`), the IR (`compiler.ir`), the reference
interpreter (`compiler.interpret`) and graph autodiff (`compiler.autodiff`).
Nothing here imports `runtime` or `hybridnet`.
"""
