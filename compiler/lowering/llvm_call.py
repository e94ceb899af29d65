"""`hn_call`: the llvm kernel's entry from Python in one ctypes call, without a Python
object per buffer.

Gathering a buffer's address in Python (`a.__array_interface__`) costs about a
microsecond per array, so a traced call of a small kernel spent ten times longer
building its pointer table than running. `hn_call(args, static)` does that part in
machine code instead: `args` is a Python tuple (the inputs, the outputs, the scratch
arena), `static` a table of int64 words the runtime fills once per kernel
(runtime.llvm_kernel.fast_layout, which verifies them on live objects first):

    0 ob_type offset   1 the ndarray type       2 offset of a tuple's items
    3 data offset      4 nd offset              5 dimensions offset
    6 descr offset     7 flags offset           8 flags mask (C-contiguous, aligned)
    9 the BLAS table   10.. one expected dtype (descr) per input, the constants'
    addresses, the temporaries' offsets in the arena

Each input is checked (an exact ndarray of the expected dtype object, rank and sizes,
C-contiguous and aligned); a failed check returns -1 before anything runs, and the
caller takes its checked path (which converts or raises a clear error). Otherwise the
kernel runs and `hn_call` returns its status byte (1: an index out of range), or 0.
Offsets come from the table, not the code, so the object code holds no layout of this
Python or NumPy and stays cacheable.
"""

from llvmlite import ir

from .llvm_arena import ALIGN
from .llvm_buf import I8P, I32, I64
from .llvm_program import CALL

HEADER = 10  # words of `static` before the per-input dtypes


def emit_call(module, entry, program, n_bufs, first_temp):
    """Add `hn_call` to `module` for `program` (an LLProgram with inputs, consts,
    outputs, temps and status set), calling `entry` (hn_entry)."""
    fn = ir.Function(module, ir.FunctionType(I64, [I8P, I64.as_pointer()]), CALL)
    # Straight-line checks that run once per call: LLVM's optimizer and its selection
    # DAG took ~40% of a small kernel's compile time on them (22 of 60 ms) for code
    # that runs in well under a microsecond either way, so they are left unoptimized.
    fn.attributes.add("optnone")
    fn.attributes.add("noinline")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    args, static = fn.args
    fail = fn.append_basic_block("fail")
    n_in, n_out = len(program.inputs), len(program.outputs)
    words = [b.load(b.gep(static, [I64(k)])) for k in range(HEADER)]
    table = b.alloca(I8P, I64(max(1, n_bufs)))

    def check(cond):
        ok = fn.append_basic_block("ok")
        b.cbranch(cond, ok, fail)
        b.position_at_end(ok)

    def field(obj, k, ty):  # (the field at offset words[k] of a Python object)
        return b.load(b.bitcast(b.gep(obj, [words[k]]), ty.as_pointer()))

    def item(j):
        at = b.add(words[2], I64(8 * j))
        return b.load(b.bitcast(b.gep(args, [at]), I8P.as_pointer()))

    def put(slot, ptr):
        b.store(ptr, b.gep(table, [I64(slot)]))

    for k, (shape, _) in enumerate(program.inputs):
        obj = item(k)
        check(b.icmp_unsigned("==", b.ptrtoint(field(obj, 0, I8P), I64), words[1]))
        want = b.load(b.gep(static, [I64(HEADER + k)]))
        check(b.icmp_unsigned("==", b.ptrtoint(field(obj, 6, I8P), I64), want))
        check(b.icmp_signed("==", field(obj, 4, I32), I32(len(shape))))
        flags = b.zext(field(obj, 7, I32), I64)
        check(b.icmp_unsigned("==", b.and_(flags, words[8]), words[8]))
        dims = field(obj, 5, I64.as_pointer())
        for d, size in enumerate(shape):
            check(b.icmp_signed("==", b.load(b.gep(dims, [I64(d)])), I64(size)))
        put(k, field(obj, 3, I8P))
    consts_at = HEADER + n_in
    for c in range(len(program.consts)):
        put(n_in + c, b.inttoptr(b.load(b.gep(static, [I64(consts_at + c)])), I8P))
    for j in range(n_out):
        put(n_in + len(program.consts) + j, field(item(n_in + j), 3, I8P))
    if program.temps:
        data = b.ptrtoint(field(item(n_in + n_out), 3, I8P), I64)
        base = b.and_(b.add(data, I64(ALIGN - 1)), I64(-ALIGN))
        temps_at = consts_at + len(program.consts)
        _temp_loop(fn, b, table, static, base, first_temp, temps_at, len(program.temps))
    status = None
    if program.status >= 0:
        status = b.load(b.gep(table, [I64(first_temp + program.status)]))
        b.store(ir.Constant(ir.IntType(8), 0), status)
    b.call(entry, [table, b.inttoptr(words[9], I8P.as_pointer()), I64(0), I64(0)])
    b.ret(I64(0) if status is None else b.zext(b.load(status), I64))
    b.position_at_end(fail)
    b.ret(I64(-1))
    return fn


def emit_refusing_call(module):
    """An `hn_call` that refuses every call (returns -1): the caller takes its checked
    path, where the pointers are gathered in Python (kernels for symbolic lengths,
    whose sizes the runtime computes; compiler.lowering.llvm_sym)."""
    fn = ir.Function(module, ir.FunctionType(I64, [I8P, I64.as_pointer()]), CALL)
    ir.IRBuilder(fn.append_basic_block("entry")).ret(I64(-1))
    return fn


def _temp_loop(fn, b, table, static, base, first_temp, temps_at, n):
    """table[first_temp + t] = base + static[temps_at + t] for t < n (an IR loop)."""
    pre = b.block
    head, body, done = (fn.append_basic_block(s) for s in ("temps", "temp", "temps_done"))
    b.branch(head)
    b.position_at_end(head)
    t = b.phi(I64)
    t.add_incoming(I64(0), pre)
    b.cbranch(b.icmp_signed("<", t, I64(n)), body, done)
    b.position_at_end(body)
    offset = b.load(b.gep(static, [b.add(t, I64(temps_at))]))
    b.store(b.inttoptr(b.add(base, offset), I8P), b.gep(table, [b.add(t, I64(first_temp))]))
    t.add_incoming(b.add(t, I64(1)), body)
    b.branch(head)
    b.position_at_end(done)


__all__ = ["emit_call", "emit_refusing_call", "CALL", "HEADER"]
