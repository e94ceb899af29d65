"""hybridnet's runtime layer: guards, caches, executor and JIT engines.

Populated by the tracing-JIT work; it imports `compiler` only, never `hybridnet`.
"""
