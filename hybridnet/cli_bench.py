"""`hybridnet bench`: built-in workloads timed with hybridnet (eager and `hn.trace`, by
`hn.benchmark`), a hand-written NumPy version and the installed peers (PyTorch eager,
`torch.compile`, `jax.jit`, by the same per-call median and calibration).

A workload is a class: default sizes, the data for a size (NumPy arrays every
implementation shares) and one builder per implementation returning a call without
arguments. `run()` returns plain rows; `format_table()`, `write_json()` and `write_plot()`
present them."""

import contextlib
import importlib
import json
import math
import os
import platform
import sys
import tempfile
import time

import numpy as np
from tqdm import tqdm

import hybridnet as hn
import hybridnet.nn.functional as F
from hybridnet.jit.bench import _calibrate, _fmt, _median_per_call
from hybridnet.jit.traced import default_backend

IMPLS = ("hn eager", "hn traced", "numpy", "torch", "torch.compile", "jax.jit")
# break-even: calls after which a compiled implementation paid back its compile time
# against the eager run of the same framework
BASELINES = {"hn traced": "hn eager", "torch.compile": "torch"}
HIDDEN, CLASSES, BATCH, LR = 256, 10, 64, 0.01
RNN_IN, RNN_HIDDEN, RNN_BATCH = 32, 64, 16
RNN_PARAMS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


class BenchError(Exception):
    """A user-facing problem with a bench request (exit status in `.status`)."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = status


# ---- workloads ---------------------------------------------------------------------------

class Workload:
    """A computation, its default sizes, and one builder per implementation.

    Builders return a call without arguments; `hn()` returns `(fn, args, grad)`: the
    function to time eagerly and traced, its arguments, and whether grad mode is on."""

    name = summary = size_name = ""
    sizes: tuple = ()

    def data(self, size: int) -> dict:
        """NumPy inputs and weights for one size (seeded: every run computes the same)."""
        raise NotImplementedError

    def hn(self, data):
        """(function, args, grad mode) for hybridnet."""
        raise NotImplementedError

    def numpy(self, data):
        """A call of the hand-written NumPy version."""
        raise NotImplementedError

    def torch(self, torch, data, wrap):
        """A call of the PyTorch version, its function passed through `wrap` (identity or
        `torch.compile`)."""
        raise NotImplementedError

    def jax(self, jax, data):
        """A call of the `jax.jit` version (waits for the result)."""
        raise NotImplementedError


def _chain(x):
    return (x * 2 + 1).tanh() * x.sigmoid() - x.exp() * 0.1


class Elementwise(Workload):
    """W1: an elementwise chain on a float32 vector."""

    name, size_name = "elementwise", "elements"
    summary = "(x * 2 + 1).tanh() * x.sigmoid() - x.exp() * 0.1, float32"
    sizes = (2 ** 10, 2 ** 16, 2 ** 20)

    def data(self, size):
        return {"x": np.random.default_rng(0).standard_normal(size).astype(np.float32)}

    def hn(self, data):
        return _chain, (hn.from_numpy(data["x"]),), False

    def numpy(self, data):
        a, one = data["x"], np.float32(1)
        return lambda: (np.tanh(a * np.float32(2) + one) * (one / (one + np.exp(-a)))
                        - np.exp(a) * np.float32(0.1))

    def torch(self, torch, data, wrap):
        f, t = wrap(_chain), torch.from_numpy(data["x"])
        return lambda: f(t)

    def jax(self, jax, data):
        jnp = jax.numpy
        f = jax.jit(lambda v: jnp.tanh(v * 2 + 1) * jax.nn.sigmoid(v) - jnp.exp(v) * 0.1)
        x = jnp.asarray(data["x"])
        return lambda: f(x).block_until_ready()


def _hn_mlp(size):
    hn.manual_seed(0)
    nn = hn.nn
    return nn.Sequential(nn.Linear(size, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN),
                         nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def _mlp_data(size):
    rng = np.random.default_rng(0)
    ws = [(m.weight.detach().numpy().copy(), m.bias.detach().numpy().copy())
          for m in _hn_mlp(size) if isinstance(m, hn.nn.Linear)]
    return {"x": rng.standard_normal((BATCH, size)).astype(np.float32),
            "y": rng.integers(0, CLASSES, BATCH), "ws": ws, "size": size}


def _np_forward(ws, x):
    acts = [x]
    for i, (w, b) in enumerate(ws):
        z = acts[-1] @ w.T + b
        acts.append(np.maximum(z, 0) if i < len(ws) - 1 else z)
    return acts


def _torch_mlp(torch, ws):
    layers = []
    for i, (w, b) in enumerate(ws):
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
        layers += [lin, torch.nn.ReLU()] if i < len(ws) - 1 else [lin]
    return torch.nn.Sequential(*layers)


def _jax_mlp(jax, params, x):
    for i, (w, b) in enumerate(params):
        x = x @ w.T + b
        if i < len(params) - 1:
            x = jax.numpy.maximum(x, 0)
    return x


class MLP(Workload):
    """MLP inference, batch 64."""

    name, size_name = "mlp", "input features"
    summary = f"MLP inference size-{HIDDEN}-{HIDDEN}-{CLASSES}, ReLU, batch {BATCH}, no grad"
    sizes = (64, 256, 784)

    def data(self, size):
        return _mlp_data(size)

    def hn(self, data):
        return _hn_mlp(data["size"]), (hn.from_numpy(data["x"]),), False

    def numpy(self, data):
        return lambda: _np_forward(data["ws"], data["x"])[-1]

    def torch(self, torch, data, wrap):
        model, x = wrap(_torch_mlp(torch, data["ws"])), torch.from_numpy(data["x"])

        def call():
            with torch.no_grad():
                return model(x)
        return call

    def jax(self, jax, data):
        params = [(jax.numpy.asarray(w), jax.numpy.asarray(b)) for w, b in data["ws"]]
        f, x = jax.jit(lambda p, v: _jax_mlp(jax, p, v)), jax.numpy.asarray(data["x"])
        return lambda: f(params, x).block_until_ready()


def training_step(forward, opt):
    """The training step users write: zero_grad, cross-entropy of `forward(x)` against
    `y`, backward, step; returns the detached loss (also benchmarks/training.py's)."""
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(forward(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def numpy_train_step(ws, x, y, lr=None):
    """A hand-written NumPy MLP training step on [(W, b), ...] (ReLU between layers):
    forward, softmax cross-entropy, backward and an SGD update of `ws` in place (`lr`
    default LR); returns the loss. Also benchmarks/training.py's NumPy row."""
    lr = LR if lr is None else lr
    acts = _np_forward(ws, x)
    z = acts[-1]
    e = np.exp(z - z.max(1, keepdims=True))
    p = e / e.sum(1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y]).mean()
    g = p
    g[np.arange(len(y)), y] -= 1
    g /= len(y)
    for i in range(len(ws) - 1, -1, -1):
        w, b = ws[i]
        gw, gb = g.T @ acts[i], g.sum(0)
        if i:
            g = (g @ w) * (acts[i] > 0)
        w -= lr * gw
        b -= lr * gb
    return loss


class MLPTrain(MLP):
    """One whole training step of the mlp workload's MLP, traced as one function."""

    name = "mlp-train"
    summary = "the mlp's whole training step (cross_entropy, backward, SGD), traced"

    def hn(self, data):
        model = _hn_mlp(data["size"])
        opt = hn.optim.SGD(model.parameters(), lr=LR)

        return training_step(model, opt), (hn.from_numpy(data["x"]), hn.tensor(data["y"])), True

    def numpy(self, data):
        ws = [(w.copy(), b.copy()) for w, b in data["ws"]]
        return lambda: numpy_train_step(ws, data["x"], data["y"])

    def torch(self, torch, data, wrap):
        model = _torch_mlp(torch, data["ws"])
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])

        def step():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()
        return wrap(step)

    def jax(self, jax, data):
        jnp = jax.numpy

        def loss_fn(params, x, y):
            logp = jax.nn.log_softmax(_jax_mlp(jax, params, x), axis=1)
            return -jnp.take_along_axis(logp, y[:, None], 1).mean()

        @jax.jit
        def step(params, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            return [(w - LR * gw, b - LR * gb)
                    for (w, b), (gw, gb) in zip(params, grads)], loss
        state = [[(jnp.asarray(w), jnp.asarray(b)) for w, b in data["ws"]]]
        x, y = jnp.asarray(data["x"]), jnp.asarray(data["y"])

        def call():
            state[0], loss = step(state[0], x, y)
            return loss.block_until_ready()
        return call


def _np_rnn_step(ws, xs, target):
    """Forward over the sequence, MSE on the last state, backward through time."""
    wi, wh, bi, bh = ws
    hs = [np.zeros((xs.shape[1], wh.shape[0]), np.float32)]
    for x in xs:
        hs.append(np.tanh(x @ wi.T + bi + hs[-1] @ wh.T + bh))
    diff = hs[-1] - target
    gh = diff * np.float32(2 / diff.size)
    grads = [np.zeros_like(w) for w in ws]
    for t in range(len(xs) - 1, -1, -1):
        gz = gh * (1 - hs[t + 1] * hs[t + 1])
        grads[0] += gz.T @ xs[t]
        grads[1] += gz.T @ hs[t]
        grads[2] += gz.sum(0)
        gh = gz @ wh
    grads[3][:] = grads[2]
    return (diff * diff).mean(), grads


class RNN(Workload):
    """A tanh RNNCell looped in Python over the time dim, forward + backward."""

    name, size_name = "rnn", "sequence length"
    summary = f"tanh RNNCell({RNN_IN}, {RNN_HIDDEN}) over time, batch {RNN_BATCH}, fwd + bwd"
    sizes = (8, 16, 32)

    def data(self, size):
        rng = np.random.default_rng(0)
        hn.manual_seed(0)
        cell = hn.nn.RNNCell(RNN_IN, RNN_HIDDEN)
        ws = [getattr(cell, n).detach().numpy().copy() for n in RNN_PARAMS]
        return {"xs": rng.standard_normal((size, RNN_BATCH, RNN_IN)).astype(np.float32),
                "target": rng.standard_normal((RNN_BATCH, RNN_HIDDEN)).astype(np.float32),
                "ws": ws}

    def hn(self, data):
        hn.manual_seed(0)
        cell = hn.nn.RNNCell(RNN_IN, RNN_HIDDEN)

        def rnn_step(xs, target):
            cell.zero_grad()
            h = hn.zeros(RNN_BATCH, RNN_HIDDEN)
            for t in range(xs.shape[0]):
                h = cell(xs[t], h)
            loss = F.mse_loss(h, target)
            loss.backward()
            return loss.detach()
        return rnn_step, (hn.from_numpy(data["xs"]), hn.from_numpy(data["target"])), True

    def numpy(self, data):
        return lambda: _np_rnn_step(data["ws"], data["xs"], data["target"])

    def torch(self, torch, data, wrap):
        cell = torch.nn.RNNCell(RNN_IN, RNN_HIDDEN)
        with torch.no_grad():
            for name, w in zip(RNN_PARAMS, data["ws"]):
                getattr(cell, name).copy_(torch.from_numpy(w))
        xs, target = torch.from_numpy(data["xs"]), torch.from_numpy(data["target"])

        def loss_of(xs, target):
            h = torch.zeros(RNN_BATCH, RNN_HIDDEN)
            for t in range(xs.shape[0]):
                h = cell(xs[t], h)
            return torch.nn.functional.mse_loss(h, target)
        loss_fn = wrap(loss_of)

        def call():
            cell.zero_grad()
            loss = loss_fn(xs, target)
            loss.backward()
            return loss.detach()
        return call

    def jax(self, jax, data):
        jnp = jax.numpy

        def loss_fn(params, xs, target):
            wi, wh, bi, bh = params

            def body(h, x):
                return jnp.tanh(x @ wi.T + bi + h @ wh.T + bh), None
            h, _ = jax.lax.scan(body, jnp.zeros((RNN_BATCH, RNN_HIDDEN), jnp.float32), xs)
            return ((h - target) ** 2).mean()
        f = jax.jit(jax.value_and_grad(loss_fn))
        params = [jnp.asarray(w) for w in data["ws"]]
        xs, target = jnp.asarray(data["xs"]), jnp.asarray(data["target"])
        return lambda: jax.block_until_ready(f(params, xs, target))


WORKLOADS = {w.name: w for w in (Elementwise(), MLP(), MLPTrain(), RNN())}


def check_workloads(names):
    """The workloads named (all when none); an unknown name raises BenchError (status 2)."""
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        raise BenchError(f"unknown workload{plural} {', '.join(map(repr, unknown))}; known "
                         f"workloads: {', '.join(WORKLOADS)}", status=2)
    return [WORKLOADS[n] for n in (names or WORKLOADS)]


# ---- peers and machine -------------------------------------------------------------------

def load_peers(enabled=True):
    """({"torch": module, "jax": module} of those installed, notes on the others)."""
    peers, notes = {}, []
    if not enabled:
        return peers, ["peers skipped (--no-peers)"]
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # no accelerator probing
    for name, what in (("torch", "PyTorch eager and torch.compile"), ("jax", "jax.jit")):
        try:
            peers[name] = importlib.import_module(name)
            if name == "jax":
                importlib.import_module("jax.numpy")
        except Exception as exc:  # noqa: BLE001  (any import failure: not available)
            notes.append(f"{name} not installed ({type(exc).__name__}): {what} skipped")
    return peers, notes


def machine_info(peers) -> dict:
    """Plain data on what the numbers were measured with."""
    info = {"cpu_count": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "hybridnet": hn.__version__,
            "backend": default_backend(), "numpy": np.__version__,
            "numba": importlib.import_module("numba").__version__,
            "llvmlite": importlib.import_module("llvmlite").__version__}
    if "torch" in peers:
        info["torch"] = peers["torch"].__version__
        info["torch_threads"] = peers["torch"].get_num_threads()
    if "jax" in peers:
        info["jax"] = peers["jax"].__version__
    return info


# ---- timing --------------------------------------------------------------------------------

def _time_call(call, repeat, warmup):
    """(median seconds per call over `repeat` runs, seconds of the `warmup` first calls)."""
    start = time.perf_counter()
    for _ in range(warmup):
        call()
    first = time.perf_counter() - start
    return _median_per_call(call, (), {}, repeat, _calibrate(call, (), {})), first


def _row(workload, size, impl, median, compile_s=None):
    return {"workload": workload.name, "size": size, "impl": impl, "median_s": median,
            "compile_s": compile_s}


def _hn_rows(workload, size, data, repeat):
    fn, args, grad = workload.hn(data)
    context = contextlib.nullcontext() if grad else hn.no_grad()
    with context:
        result = hn.benchmark(hn.trace(fn), *args, repeat=repeat)
    return [_row(workload, size, "hn eager", result.eager_seconds),
            _row(workload, size, "hn traced", result.compiled_seconds,
                 result.compile_seconds)]


def _jobs(workload, peers):
    """[(implementation, how to build its call from the data)] besides hybridnet's."""
    jobs = [("numpy", workload.numpy)]
    if "torch" in peers:
        torch = peers["torch"]
        jobs.append(("torch", lambda d: workload.torch(torch, d, lambda f: f)))
        jobs.append(("torch.compile", lambda d: _torch_compiled(torch, workload, d)))
    if "jax" in peers:
        jobs.append(("jax.jit", lambda d: workload.jax(peers["jax"], d)))
    return jobs


def _torch_compiled(torch, workload, data):
    """The torch.compile call, compiled afresh (dynamo's caches and recompile limit reset)."""
    torch.compiler.reset()
    return workload.torch(torch, data, torch.compile)


def _peer_row(workload, size, data, impl, build, repeat):
    compiled = impl in ("torch.compile", "jax.jit")
    median, first = _time_call(build(data), repeat, warmup=2 if compiled else 1)
    return _row(workload, size, impl, median, first if compiled else None)


def _finish(rows):
    """Add speedup (vs hn eager) and break-even calls to rows of one (workload, size)."""
    by_impl = {r["impl"]: r for r in rows}
    base = by_impl["hn eager"]["median_s"]
    for r in rows:
        r["speedup"] = base / r["median_s"] if r["median_s"] > 0 else None
        eager = by_impl.get(BASELINES.get(r["impl"]))
        r["break_even_baseline"] = eager["impl"] if eager else None
        saved = eager["median_s"] - r["median_s"] if eager else 0.0
        r["break_even_calls"] = r["compile_s"] / saved if saved > 0 else None
    rows.sort(key=lambda r: IMPLS.index(r["impl"]))
    return rows


def _progress(total, quiet):
    return tqdm(total=total, desc="bench", unit="run", file=sys.stderr, leave=False,
                disable=quiet or not sys.stderr.isatty())


def run(workloads, sizes=None, repeat=5, peers=None, quiet=False):
    """Time every (workload, size, implementation); returns (rows, notes)."""
    peers = peers or {}
    plan = [(w, s) for w in workloads for s in (sizes or w.sizes)]
    rows, notes = [], []
    with _progress(sum(1 + len(_jobs(w, peers)) for w, _ in plan), quiet) as bar:
        for workload, size in plan:
            data = workload.data(size)
            bar.set_postfix_str(f"{workload.name} {size} hn")
            group = _hn_rows(workload, size, data, repeat)
            bar.update()
            for impl, build in _jobs(workload, peers):
                bar.set_postfix_str(f"{workload.name} {size} {impl}")
                try:
                    group.append(_peer_row(workload, size, data, impl, build, repeat))
                except Exception as exc:  # noqa: BLE001  (a peer failing skips its row)
                    text = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
                    notes.append(f"{impl} failed on {workload.name} {size}: {text}")
                bar.update()
            rows.extend(_finish(group))
    return rows, notes


# ---- output ----------------------------------------------------------------------------------

def fmt_time(seconds) -> str:
    """Seconds in human units; '-' for None."""
    return "-" if seconds is None else f"{seconds:.2f} s" if seconds >= 1 else _fmt(seconds)


def _fmt_break_even(row) -> str:
    if row["break_even_baseline"] is None:
        return "-"
    calls = row["break_even_calls"]
    return "never" if calls is None else f"{math.ceil(calls):,} calls"


COLUMNS = (("size", "size", str), ("impl", "implementation", str),
           ("median_s", "median", fmt_time),
           ("speedup", "vs hn eager", lambda v: "-" if v is None else f"{v:.2f}x"),
           ("compile_s", "compile", fmt_time))


def _table(rows):
    cells = [[f(r[k]) for k, _, f in COLUMNS] + [_fmt_break_even(r)] for r in rows]
    heads = [h for _, h, _ in COLUMNS] + ["break-even"]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(cell, widths)) for cell in cells]
    return lines


def _header(m, repeat):
    torch = f", torch {m['torch']} ({m['torch_threads']} threads)" if "torch" in m else ""
    jax = f", jax {m['jax']}" if "jax" in m else ""
    return (f"hybridnet {m['hybridnet']} (backend {m['backend']}), numpy {m['numpy']}, numba "
            f"{m['numba']}, llvmlite {m['llvmlite']}{torch}{jax}; {m['cpu_count']} CPUs; "
            f"median of {repeat} runs per row")


def format_table(rows, notes, machine, repeat) -> str:
    """The printed report: one table per workload, then the legend and notes."""
    lines = [_header(machine, repeat)]
    for workload in WORKLOADS.values():
        mine = [r for r in rows if r["workload"] == workload.name]
        if mine:
            lines += ["", f"{workload.name} (size = {workload.size_name}): {workload.summary}"]
            lines += _table(mine)
    lines += ["", "median: time per call; vs hn eager: hn eager's median / this median "
              "(higher is faster);", "compile: the first two calls (trace and compile); "
              "break-even: calls after which compiling paid for itself",
              "against the same framework's eager run (hn traced vs hn eager, "
              "torch.compile vs torch)"]
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


@contextlib.contextmanager
def _atomic_path(path):
    """Yield a temporary path beside `path`; moved onto `path` only if the block succeeds."""
    folder = os.path.dirname(os.path.abspath(path))
    suffix = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path, rows, notes, machine, repeat):
    """Write rows, notes and machine info as JSON, atomically (never a half-written file)."""
    doc = {"machine": machine, "repeat": repeat, "rows": rows, "notes": notes}
    text = json.dumps(doc, indent=2, allow_nan=False)
    with _atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())


def require_matplotlib():
    """matplotlib.pyplot with the Agg backend; BenchError if matplotlib is not installed."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise BenchError("--plot needs matplotlib, which is not installed: "
                         "pip install 'hybridnet[plot]'") from None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def write_plot(path, rows):
    """Time against size per implementation, one log-log subplot per workload."""
    plt = require_matplotlib()
    names = [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]
    ncols = min(2, len(names))
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6 * ncols, 4.2 * nrows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names):
        _subplot(ax, WORKLOADS[name], [r for r in rows if r["workload"] == name])
    fig.tight_layout()
    with _atomic_path(path) as tmp:
        fig.savefig(tmp, format=os.path.splitext(path)[1][1:] or "png", dpi=100)
    plt.close(fig)


def _subplot(ax, workload, rows):
    for impl in IMPLS:
        pts = sorted((r["size"], r["median_s"]) for r in rows if r["impl"] == impl)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=impl)
    sizes = sorted({r["size"] for r in rows})
    ax.set(xscale="log", yscale="log", title=f"{workload.name}: {workload.summary}",
           xlabel=workload.size_name, ylabel="seconds per call")
    ax.title.set_fontsize("small")
    ax.tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
