"""The schedulers of hybridnet.optim.lr_scheduler that cycle or react to a metric:
ReduceLROnPlateau, CyclicLR, CosineAnnealingWarmRestarts, OneCycleLR (as PyTorch)."""

import math
import types
import warnings
from functools import partial

from ._lr_base import (
    EPOCH_DEPRECATION_WARNING,
    LRScheduler,
    _enable_get_lr_call,
    _format_param,
    _param_groups_val_list,
    _update_param_group_val,
    _warn_get_lr_called_within_step,
)
from .optimizer import Optimizer


class ReduceLROnPlateau(LRScheduler):
    """lr *= factor once a metric has stopped improving for more than `patience` epochs.

    `mode` 'min' or 'max'; an improvement beats the best so far by `threshold`, relative
    ('rel') or absolute ('abs'); after a reduction `cooldown` epochs pass before bad
    epochs count again; lr never goes below `min_lr` (one value or one per group), and
    a reduction smaller than `eps` is skipped. `step(metrics)` takes the metric.
    """

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4,
                 threshold_mode="rel", cooldown=0, min_lr=0, eps=1e-8):
        if factor >= 1.0:
            raise ValueError("Factor should be < 1.0.")
        self.factor = factor
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != len(optimizer.param_groups):
                raise ValueError(f"expected {len(optimizer.param_groups)} min_lrs, got "
                                 f"{len(min_lr)}")
            self.default_min_lr = None
            self.min_lrs = list(min_lr)
        else:
            self.default_min_lr = min_lr
            self.min_lrs = [min_lr] * len(optimizer.param_groups)
        self.patience = patience
        self.cooldown = cooldown
        self.eps = eps
        self.last_epoch = 0
        self._last_lr = _param_groups_val_list(self.optimizer, "lr")
        self._init_is_better(mode=mode, threshold=threshold, threshold_mode=threshold_mode)
        self._reset()

    def _reset(self) -> None:
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def step(self, metrics, epoch=None) -> None:
        """Record one epoch's metric (a number or a 0-d tensor); reduce lr on a plateau."""
        current = float(metrics)
        if epoch is None:
            epoch = self.last_epoch + 1
        else:
            warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
        self.last_epoch = epoch
        if self._is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad epochs in cooldown do not count
        if self.num_bad_epochs > self.patience:
            self._reduce_lr(epoch)
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = _param_groups_val_list(self.optimizer, "lr")

    def _reduce_lr(self, epoch) -> None:
        if len(self.optimizer.param_groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(
                    f"The number of param groups in the `optimizer` "
                    f"({len(self.optimizer.param_groups)}) differs from when "
                    f"`ReduceLROnPlateau` was initialized ({len(self.min_lrs)}), usually due "
                    "to a new param group being added to the optimizer. Please modify the "
                    "`min_lrs` field to match the length of the `optimizer` param groups.")
            self.min_lrs = [self.default_min_lr] * len(self.optimizer.param_groups)
        for i, group in enumerate(self.optimizer.param_groups):
            old_lr = float(group["lr"])
            new_lr = max(old_lr * self.factor, self.min_lrs[i])
            if old_lr - new_lr > self.eps:
                _update_param_group_val(group, "lr", new_lr)

    @property
    def in_cooldown(self) -> bool:
        """Whether the scheduler is within `cooldown` epochs of its last reduction."""
        return self.cooldown_counter > 0

    def _is_better(self, a, best) -> bool:
        if self.mode == "min" and self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold)
        if self.mode == "min" and self.threshold_mode == "abs":
            return a < best - self.threshold
        if self.mode == "max" and self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    def _init_is_better(self, mode, threshold, threshold_mode) -> None:
        if mode not in {"min", "max"}:
            raise ValueError("mode " + mode + " is unknown!")
        if threshold_mode not in {"rel", "abs"}:
            raise ValueError("threshold mode " + threshold_mode + " is unknown!")
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode = mode
        self.threshold = threshold
        self.threshold_mode = threshold_mode

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the attributes saved by `state_dict()`."""
        self.__dict__.update(state_dict)
        self._init_is_better(mode=self.mode, threshold=self.threshold,
                             threshold_mode=self.threshold_mode)


def _init_momentum(scheduler, optimizer, max_momentum, base_momentum, last_epoch):
    """Set up cycle_momentum: the momentum (or beta1) of every group starts at its max."""
    if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
        raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` "
                         "option enabled")
    scheduler.use_beta1 = "betas" in optimizer.defaults
    max_momentums = _format_param("max_momentum", optimizer, max_momentum)
    base_momentums = _format_param("base_momentum", optimizer, base_momentum)
    if last_epoch == -1:
        for m_momentum, b_momentum, group in zip(max_momentums, base_momentums,
                                                 optimizer.param_groups, strict=True):
            _set_momentum(scheduler, group, m_momentum)
            group["max_momentum"] = m_momentum
            group["base_momentum"] = b_momentum
    return max_momentums, base_momentums


def _set_momentum(scheduler, group, momentum) -> None:
    if scheduler.use_beta1:
        _update_param_group_val(group, "betas", (momentum, *group["betas"][1:]))
    else:
        _update_param_group_val(group, "momentum", momentum)


class CyclicLR(LRScheduler):
    """lr cycles between base_lr and max_lr (triangular, triangular2 or exp_range, or a
    custom `scale_fn`); momentum cycles inversely between max and base momentum."""

    def __init__(self, optimizer, base_lr, max_lr, step_size_up=2000, step_size_down=None,
                 mode="triangular", gamma=1.0, scale_fn=None, scale_mode="cycle",
                 cycle_momentum=True, base_momentum=0.8, max_momentum=0.9, last_epoch=-1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        base_lrs = _format_param("base_lr", optimizer, base_lr)
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups, strict=True):
                _update_param_group_val(group, "lr", lr)
        self.max_lrs = _format_param("max_lr", optimizer, max_lr)
        step_size_up = float(step_size_up)
        step_size_down = float(step_size_down) if step_size_down is not None else step_size_up
        self.total_size = step_size_up + step_size_down
        self.step_ratio = step_size_up / self.total_size
        if mode not in ["triangular", "triangular2", "exp_range"] and scale_fn is None:
            raise ValueError("mode is invalid and scale_fn is None")
        self.mode = mode
        self.gamma = gamma
        self._scale_fn_custom = scale_fn
        self.scale_mode = scale_mode
        self._init_scale_fn()
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self.max_momentums, self.base_momentums = _init_momentum(
                self, optimizer, max_momentum, base_momentum, last_epoch)
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def _init_scale_fn(self) -> None:
        if self._scale_fn_custom is not None:
            return
        if self.mode == "triangular":
            self._scale_fn_ref, self.scale_mode = self._triangular_scale_fn, "cycle"
        elif self.mode == "triangular2":
            self._scale_fn_ref, self.scale_mode = self._triangular2_scale_fn, "cycle"
        elif self.mode == "exp_range":
            self._scale_fn_ref = partial(self._exp_range_scale_fn, self.gamma)
            self.scale_mode = "iterations"

    def scale_fn(self, x) -> float:
        """The amplitude scale for cycle (or iteration) x."""
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        return self._scale_fn_ref(x)

    @staticmethod
    def _triangular_scale_fn(x):
        return 1.0

    @staticmethod
    def _triangular2_scale_fn(x):
        return 1 / (2.0 ** (x - 1))

    @staticmethod
    def _exp_range_scale_fn(gamma, x):
        return gamma ** x

    def get_lr(self) -> list:
        """The learning rates (and, as a side effect, momenta) for last_epoch."""
        _warn_get_lr_called_within_step(self)
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        if x <= self.step_ratio:
            scale_factor = x / self.step_ratio
        else:
            scale_factor = (x - 1) / (self.step_ratio - 1)
        at = cycle if self.scale_mode == "cycle" else self.last_epoch
        lrs = [base_lr + (max_lr - base_lr) * scale_factor * self.scale_fn(at)
               for base_lr, max_lr in zip(self.base_lrs, self.max_lrs, strict=True)]
        if self.cycle_momentum:
            momentums = [max_m - (max_m - base_m) * scale_factor * self.scale_fn(at)
                         for base_m, max_m in zip(self.base_momentums, self.max_momentums,
                                                  strict=True)]
            for group, momentum in zip(self.optimizer.param_groups, momentums, strict=True):
                _set_momentum(self, group, momentum)
        return lrs

    def state_dict(self) -> dict:
        """Every attribute except the optimizer and the scale function (a custom callable
        object's attributes are kept)."""
        state = super().state_dict()
        state.pop("_scale_fn_ref", None)
        fn = state.pop("_scale_fn_custom")
        state["_scale_fn_custom"] = None
        if fn is not None and not isinstance(fn, types.FunctionType):
            state["_scale_fn_custom"] = fn.__dict__.copy()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the attributes saved by `state_dict()`."""
        state_dict = dict(state_dict)
        fn = state_dict.pop("_scale_fn_custom")
        super().load_state_dict(state_dict)
        if fn is not None:
            self._scale_fn_custom.__dict__.update(fn)
        self._init_scale_fn()


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing from initial_lr to eta_min over T_i epochs, restarting at
    initial_lr with T_i = T_0, T_0 * T_mult, ... (SGDR)."""

    def __init__(self, optimizer, T_0, T_mult=1, eta_min=0.0, last_epoch=-1):  # noqa: N803
        if T_0 <= 0 or not isinstance(T_0, int):
            raise ValueError(f"Expected positive integer T_0, but got {T_0}")
        if T_mult < 1 or not isinstance(T_mult, int):
            raise ValueError(f"Expected integer T_mult >= 1, but got {T_mult}")
        if not isinstance(eta_min, (float, int)):
            raise ValueError(f"Expected float or int eta_min, but got {eta_min} of type "
                             f"{type(eta_min)}")
        self.T_0 = T_0
        self.T_i = T_0
        self.T_mult = T_mult
        self.eta_min = eta_min
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        """The cosine for T_cur within the current period T_i."""
        _warn_get_lr_called_within_step(self)
        return [self.eta_min + (base_lr - self.eta_min)
                * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
                for base_lr in self.base_lrs]

    def step(self, epoch=None) -> None:
        """Advance one epoch, or jump to a (fractional) `epoch`."""
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur = self.T_cur % self.T_i
                self.T_i = self.T_i * self.T_mult
        else:
            if epoch < 0:
                raise ValueError(f"Expected non-negative epoch, but got {epoch}")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:
                    n = int(math.log((epoch / self.T_0 * (self.T_mult - 1) + 1), self.T_mult))
                    self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
                    self.T_i = self.T_0 * self.T_mult ** n
            else:
                self.T_i = self.T_0
                self.T_cur = epoch
        self.last_epoch = math.floor(epoch)
        with _enable_get_lr_call(self):
            for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
                _update_param_group_val(group, "lr", lr)
        self._last_lr = _param_groups_val_list(self.optimizer, "lr")


def _positive_int(name, value):
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"Expected positive integer {name}, but got {value}")
    return value


class OneCycleLR(LRScheduler):
    """The 1cycle policy, stepped once per batch: lr warms up from max_lr / div_factor to
    max_lr over pct_start of `total_steps` (or epochs * steps_per_epoch), then anneals
    ('cos' or 'linear') to initial_lr / final_div_factor; `three_phase` comes back down to
    initial_lr first. With cycle_momentum, momentum (or Adam's beta1) moves inversely
    between max_momentum and base_momentum."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
                 pct_start=0.3, anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85,
                 max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False,
                 last_epoch=-1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        if total_steps is not None:
            self.total_steps = _positive_int("total_steps", total_steps)
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = (_positive_int("epochs", epochs)
                                * _positive_int("steps_per_epoch", steps_per_epoch))
        else:
            raise ValueError("You must define either total_steps OR (epochs AND "
                             "steps_per_epoch)")
        up = float(pct_start * self.total_steps) - 1
        if three_phase:
            self._schedule_phases = [
                _phase(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                _phase(float(2 * pct_start * self.total_steps) - 2, "max_lr", "initial_lr",
                       "base_momentum", "max_momentum"),
                _phase(self.total_steps - 1, "initial_lr", "min_lr", "max_momentum",
                       "max_momentum")]
        else:
            self._schedule_phases = [
                _phase(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                _phase(self.total_steps - 1, "max_lr", "min_lr", "base_momentum",
                       "max_momentum")]
        if pct_start < 0 or pct_start > 1 or not isinstance(pct_start, float):
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ["cos", "linear"]:
            raise ValueError("anneal_strategy must be one of 'cos' or 'linear', instead got "
                             f"{anneal_strategy}")
        self._anneal_func_type = anneal_strategy
        max_lrs = _format_param("max_lr", self.optimizer, max_lr)
        if last_epoch == -1:
            for idx, group in enumerate(self.optimizer.param_groups):
                group["initial_lr"] = max_lrs[idx] / div_factor
                group["max_lr"] = max_lrs[idx]
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            _init_momentum(self, optimizer, max_momentum, base_momentum, last_epoch)
        super().__init__(optimizer, last_epoch)

    def _anneal_func(self, start, end, pct):
        if self._anneal_func_type == "cos":
            return self._annealing_cos(start, end, pct)
        return self._annealing_linear(start, end, pct)

    @staticmethod
    def _annealing_cos(start, end, pct):
        return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)

    @staticmethod
    def _annealing_linear(start, end, pct):
        return (end - start) * pct + start

    def get_lr(self) -> list:
        """The learning rates (and, as a side effect, momenta) for step last_epoch."""
        _warn_get_lr_called_within_step(self)
        lrs = []
        step_num = self.last_epoch
        if step_num > self.total_steps:
            raise ValueError(f"Tried to step {step_num} times. The specified number of total "
                             f"steps is {self.total_steps}")
        last = len(self._schedule_phases) - 1
        for group in self.optimizer.param_groups:
            start_step = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end_step = phase["end_step"]
                if step_num <= end_step or i == last:
                    pct = (step_num - start_step) / (end_step - start_step)
                    lrs.append(self._anneal_func(group[phase["start_lr"]],
                                                 group[phase["end_lr"]], pct))
                    if self.cycle_momentum:
                        _set_momentum(self, group, self._anneal_func(
                            group[phase["start_momentum"]], group[phase["end_momentum"]], pct))
                    break
                start_step = phase["end_step"]
        return lrs


def _phase(end_step, start_lr, end_lr, start_momentum, end_momentum) -> dict:
    return {"end_step": end_step, "start_lr": start_lr, "end_lr": end_lr,
            "start_momentum": start_momentum, "end_momentum": end_momentum}
