"""Process-wide autograd state: grad mode and the active `hn.record()` blocks.

Like PyTorch's grad mode this is a global switch; hybridnet is not thread-safe
for concurrent grad-mode changes.
"""


class _State:
    __slots__ = ("grad", "recorders")

    def __init__(self):
        self.grad = True
        self.recorders = []


STATE = _State()
