"""The llvm kernel's scratch arena (compiler.lowering.llvm_arena): temporaries whose
lifetimes overlap never share bytes; dead ones are reused; a reused block keeps one alias
group; kernels run as eagerly with their temporaries packed.

Oracles: a brute-force overlap check over random lifetimes; eager hybridnet.
"""

import numpy as np
import pytest

import hybridnet as hn
import hybridnet.nn as nn
import hybridnet.nn.functional as F
from compiler.lowering.llvm_arena import ALIGN, FOREVER, plan


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.parametrize("seed", range(20))
def test_live_temporaries_never_share_bytes(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    sizes = [int(s) for s in rng.integers(1, 5000, n)]
    firsts = rng.integers(0, 30, n)
    lives = [(int(f), int(f + rng.integers(0, 8))) for f in firsts]
    lives[0] = (-1, FOREVER)
    offsets, groups, total = plan(sizes, lives)
    for i in range(n):
        assert offsets[i] % ALIGN == 0 and offsets[i] + sizes[i] <= total
        for j in range(i):
            live = lives[i][0] <= lives[j][1] and lives[j][0] <= lives[i][1]
            bytes_i = (offsets[i], offsets[i] + sizes[i])
            bytes_j = (offsets[j], offsets[j] + sizes[j])
            if live:
                assert not _overlap(bytes_i, bytes_j), (i, j, lives[i], lives[j])
            if _overlap(bytes_i, bytes_j):
                assert groups[i] == groups[j]  # (one alias scope for shared bytes)
    assert total <= sum(-(-s // ALIGN) * ALIGN for s in sizes)


def test_dead_temporaries_are_reused_and_split_kernels_keep_them_apart():
    sizes, lives = [4096, 4096, 4096], [(0, 1), (2, 3), (4, 5)]
    offsets, groups, total = plan(sizes, lives)
    assert offsets == [0, 0, 0] and total == 4096 and len(set(groups)) == 1
    offsets, groups, total = plan(sizes, lives, share=False)
    assert offsets == [0, 4096, 8192] and total == 3 * 4096 and len(set(groups)) == 3
    # (a dead block much larger than the new temporary is left alone)
    offsets, _, _ = plan([1 << 20, 64], [(0, 0), (1, 1)])
    assert offsets[1] == 1 << 20


def test_a_deep_chain_runs_in_a_small_arena_and_as_eagerly():
    hn.manual_seed(0)
    layers = [nn.Linear(32, 32) for _ in range(12)]

    def fn(x):
        for lin in layers:
            x = F.gelu(lin(x)) + x * 0.5
        return hn.softmax(x, -1)
    tf = hn.trace(fn, backend="llvm")
    x = hn.randn(16, 32)
    with hn.no_grad():
        tf(x)
        got = tf(x)
        want = fn(x)
    program = next(iter(tf.specializations.values())).traces[0].result.program
    assert program.arena < sum(program.temps) / 2, (program.arena, sum(program.temps))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
