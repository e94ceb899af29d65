"""`Optimizer` base: parameter groups, per-parameter state, zero_grad, state dicts."""

import copy

import numpy as np

from ..autograd import enable_grad, no_grad
from ..capture import active
from ..tensor import Tensor, wrap
from .tracked import ParamGroup, StateDict, bump


def _get(group, key):
    return dict.__getitem__(group, key)


class Optimizer:
    """Base class: `params` is an iterable of tensors or of dicts (parameter groups).

    Parameter groups and state are versioned dicts (`hybridnet.optim.tracked`): the JIT
    guards a traced step on the version; float settings named in `hyper_keys` are read
    afresh at every compiled call instead.
    """

    hyper_keys = ("lr",)

    def __init__(self, params, defaults: dict):
        object.__setattr__(self, "_hn_version", [0])
        self.defaults = dict(defaults)
        self.state = {}
        self.param_groups = []
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, group: dict) -> None:
        """Add a group of parameters with its own hyper-parameters."""
        group = dict(group)
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"{type(self).__name__}: parameters must be tensors, got "
                                f"{type(p).__name__}")
            if not p.is_leaf:  # frozen (requires_grad=False) leaves are fine, as in PyTorch
                raise ValueError(f"{type(self).__name__}: cannot optimize a non-leaf tensor "
                                 f"of shape {list(p.shape)}")
            if id(p) in seen:
                raise ValueError("some parameters appear in more than one parameter group")
        group["params"] = params
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self.param_groups.append(ParamGroup(group, self._hn_version, self.hyper_keys))
        bump(self._hn_version)

    def __setattr__(self, name, value):
        if name == "state" and not isinstance(value, StateDict):
            value = StateDict(self._hn_version, value)
        object.__setattr__(self, name, value)
        bump(self._hn_version)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset gradients of every parameter."""
        for group in self.param_groups:
            for p in _get(group, "params"):
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    with no_grad():
                        p.grad.zero_()

    def step(self, closure=None):
        """Apply one update (implemented by subclasses in `_update`)."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        rec = active()
        if rec is not None:
            rec.note_optimizer(self)
        with no_grad():
            for group in self.param_groups:
                for p in _get(group, "params"):
                    grad = p.grad
                    if grad is not None:
                        state = self.state.get(p)
                        if state is None:
                            state = self.state[p] = StateDict(self._hn_version)
                        self._update(p, grad, state, group)
        return loss

    def _update(self, p, grad, state, group):
        raise NotImplementedError

    # ---- state dicts ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """{'state': {index: {...}}, 'param_groups': [{..., 'params': [index, ...]}]}."""
        index, groups = {}, []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                packed["params"].append(index[id(p)])
            groups.append(packed)
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state:
                    state[index[id(p)]] = {k: (v.detach() if isinstance(v, Tensor) else v)
                                           for k, v in self.state[p].items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore hyper-parameters and state saved by `state_dict()`."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(groups)} parameter groups, the "
                             f"optimizer has {len(self.param_groups)}")
        by_index = {}
        for mine, saved in zip(self.param_groups, groups):
            if len(mine["params"]) != len(saved["params"]):
                raise ValueError("loaded state dict has a group of a different size "
                                 f"({len(saved['params'])} vs {len(mine['params'])} params)")
            for k, v in saved.items():
                if k != "params":
                    mine[k] = copy.deepcopy(v)
            by_index.update(zip(saved["params"], mine["params"]))
        state = {}
        for key, entry in state_dict["state"].items():
            p = by_index.get(int(key))
            if p is None:
                raise ValueError(f"loaded state refers to unknown parameter index {key}")
            state[p] = StateDict(self._hn_version,
                                 {k: self._restore(v, p, k) for k, v in entry.items()})
        self.state = state

    @staticmethod
    def _restore(value, p, key):
        if isinstance(value, Tensor):
            arr = value._data
        elif isinstance(value, np.ndarray):
            arr = value
        else:
            return value
        if key != "step" and arr.shape != p.shape:
            raise ValueError(f"optimizer state {key!r} has shape {list(arr.shape)}, the "
                             f"parameter has {list(p.shape)}")
        return wrap(np.array(arr, dtype=arr.dtype, copy=True))

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for k, v in sorted(group.items()):
                if k != "params":
                    lines.append(f"    {k}: {v}")
        lines.append(")")
        return "\n".join(lines)
