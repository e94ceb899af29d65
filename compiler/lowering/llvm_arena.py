"""Where an llvm kernel's temporaries live in its scratch arena: a temporary takes the
bytes of one whose last reader ran before it is first written (the numba backend's
BufferPlanner reuses dead arrays the same way).

Lifetimes are in units (fusion groups and node units, in emission order) and come from
the first of the two emissions (llvm_emit._Kernel records, per temporary, the unit that
made it and the last unit that used its pointer, also through a view). Temporaries that
share bytes share a *group*: the alias scopes of the kernel's no-alias metadata are per
group, so LLVM never moves an access of one across an access of the other. Kernels whose
rows are split across threads keep every temporary apart (threads at different units
would write one's rows while reading the other's).
"""

from dataclasses import dataclass

ALIGN = 64  # bytes; every temporary starts at a multiple (the runtime aligns the arena)
FOREVER = float("inf")


@dataclass
class _Block:
    offset: int
    size: int
    free_after: float  # the last unit that uses its current tenant
    group: int


def _rounded(nbytes) -> int:
    return -(-int(nbytes) // ALIGN) * ALIGN


def plan(sizes, lives, share=True, apart=()):
    """(offsets, groups, arena bytes) for temporaries of `sizes` bytes, each live over
    the units `lives[k] = (first, last)`. A temporary reuses the smallest free block that
    holds it without wasting more than its own size; else it gets new bytes at the end.
    Temporaries in `apart` (those whose size a symbolic length sets: llvm_sym) share with
    nothing and come after all the others, in order, so the plan of the rest never
    depends on their sizes."""
    offsets, groups = [0] * len(sizes), [0] * len(sizes)
    blocks, total = [], 0
    order = sorted((k for k in range(len(sizes)) if k not in apart),
                   key=lambda k: (lives[k][0], k)) + sorted(apart)
    for k in order:
        need = _rounded(sizes[k]) or ALIGN
        first, last = lives[k]
        best = None
        if share and k not in apart:
            for b in blocks:
                if b.free_after < first and need <= b.size <= 2 * need and \
                        (best is None or b.size < best.size):
                    best = b
        if best is None:
            best = _Block(total, need, last, len(blocks))
            blocks.append(best)
            total += need
        best.free_after = last
        offsets[k], groups[k] = best.offset, best.group
    return offsets, groups, total


def rounded(nbytes) -> int:
    """`nbytes` rounded up to ALIGN (at least ALIGN): the bytes a temporary takes."""
    return _rounded(nbytes) or ALIGN


__all__ = ["plan", "rounded", "ALIGN", "FOREVER"]
