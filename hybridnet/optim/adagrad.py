"""Adagrad, as torch.optim.Adagrad defines it (its state exists from construction on)."""

import numpy as np

from ..dtypes import float64
from ..functional import sqrt
from ..tensor import wrap
from .optimizer import Optimizer, _get
from .rmsprop import _check, _no_differentiable
from .tracked import StateDict, hyper


class Adagrad(Optimizer):
    """Scale each coordinate's step by the root of its summed squared gradients.

    The learning rate decays as lr / (1 + (step - 1) * lr_decay). As in PyTorch the
    state (`step`, `sum` filled with `initial_accumulator_value`) is created by the
    constructor. `foreach` and `fused` are accepted and stored for PyTorch compatibility.
    """

    hyper_keys = ("lr", "lr_decay", "weight_decay", "eps")

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0,
                 eps=1e-10, foreach=None, *, maximize=False, differentiable=False, fused=None):
        for name, value in (("learning rate", lr), ("lr_decay", lr_decay),
                            ("weight_decay", weight_decay),
                            ("initial_accumulator_value", initial_accumulator_value),
                            ("epsilon", eps)):
            _check(name, value)
        _no_differentiable("Adagrad", differentiable)
        if fused and foreach:
            raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps,
                                      weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      foreach=foreach, maximize=maximize,
                                      differentiable=differentiable, fused=fused))
        for group in self.param_groups:
            for p in _get(group, "params"):
                self.state[p] = StateDict(self._hn_version)
                self._init_state(p, self.state[p])

    def _init_state(self, p, state):
        state["step"] = wrap(np.zeros((), np.float32))
        state["sum"] = wrap(np.full_like(p._data, self.defaults["initial_accumulator_value"]))

    def _update(self, p, grad, state, group):
        if not state:  # a parameter group added after construction
            self._init_state(p, state)
        # the decayed rate in double precision, as PyTorch computes it from Python floats
        step = state["step"].add_(1).to(float64)
        g = -grad if _get(group, "maximize") else grad
        weight_decay = hyper(group, "weight_decay")
        if weight_decay:
            g = g + p * weight_decay
        clr = hyper(group, "lr") / (1 + (step - 1) * hyper(group, "lr_decay"))
        state_sum = state["sum"]
        state_sum.add_(g * g)
        std = sqrt(state_sum) + hyper(group, "eps")
        p.add_(g / std, alpha=-clr)
