"""PyTorch's time_sequence_prediction example in hybridnet: two LSTMCells and a Linear
unrolled over a sine wave by a plain Python loop (a long trace for `hn.trace`).

    python examples/time_sequence.py [steps]

prints the eager and compiled outputs' largest difference and the per-call times.
`benchmarks/compile_scaling.py` and `tests/test_compile_scaling.py` use this model.
"""

import sys
import time

import numpy as np

import hybridnet as hn


class Sequence(hn.nn.Module):
    """LSTMCell(1, 51) -> LSTMCell(51, 51) -> Linear(51, 1) at every time step, float64."""

    def __init__(self):
        super().__init__()
        self.lstm1 = hn.nn.LSTMCell(1, 51, dtype=np.float64)
        self.lstm2 = hn.nn.LSTMCell(51, 51, dtype=np.float64)
        self.linear = hn.nn.Linear(51, 1, dtype=np.float64)

    def forward(self, x):
        zeros = lambda: hn.zeros(x.shape[0], 51, dtype=np.float64)  # noqa: E731
        h, c, h2, c2 = zeros(), zeros(), zeros(), zeros()
        outputs = []
        for t in range(x.shape[1]):
            h, c = self.lstm1(x[:, t:t + 1], (h, c))
            h2, c2 = self.lstm2(h, (h2, c2))
            outputs.append(self.linear(h2))
        return hn.cat(outputs, 1)


def sine_wave(steps: int, batch: int = 10) -> hn.Tensor:
    """`batch` rows of a sine wave over `steps` time steps, float64."""
    t = np.arange(batch * steps, dtype=np.float64).reshape(batch, steps)
    return hn.tensor(np.sin(t / 20.0))


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    hn.manual_seed(0)
    model, x = Sequence(), sine_wave(steps)
    traced = hn.trace(model)
    with hn.no_grad():
        model(x)  # (warm-up)
        start = time.perf_counter()
        eager = model(x)
        eager_s = time.perf_counter() - start
        for _ in range(2):  # records, then compiles
            traced(x)
        start = time.perf_counter()
        compiled = traced(x)
        compiled_s = time.perf_counter() - start
    diff = float(np.max(np.abs(eager.numpy() - compiled.numpy())))
    print(f"{steps} steps: eager {eager_s * 1e3:.2f} ms, compiled {compiled_s * 1e3:.2f} ms, "
          f"max |eager - compiled| = {diff:.1e}")


if __name__ == "__main__":
    main()
