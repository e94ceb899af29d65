"""Exceptions raised by ops: each names the op, the shapes and the dtypes involved."""


class OpError(RuntimeError, ValueError):
    """An op was applied to inputs it cannot take.

    Subclasses both RuntimeError (what PyTorch raises) and ValueError (what NumPy
    users catch), so either style of handler works.
    """


class ShapeError(OpError):
    """Input shapes do not fit the op (not broadcastable, wrong rank, bad dim...)."""


class DTypeError(OpError, TypeError):
    """Input dtypes do not fit the op (e.g. a float op given a bool mask)."""


def describe(shapes, dtypes) -> str:
    """Render operands as 'float32[3, 4], int64[2]' for error messages."""
    parts = []
    for shape, dtype in zip(shapes, dtypes):
        parts.append(f"{dtype}[{', '.join(str(s) for s in shape)}]")
    return ", ".join(parts)


class LoweringError(OpError):
    """The graph uses something a backend cannot lower (the caller falls back)."""


class ExportError(ValueError):
    """A graph cannot be exported, or a file cannot be loaded as an exported graph (the
    message names the function, op, input or field, and what to do)."""
