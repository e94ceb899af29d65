"""Module forms of the losses in `hybridnet.nn.losses`: BCELoss, SmoothL1Loss, HuberLoss,
KLDivLoss and CosineSimilarity, with PyTorch's constructor signatures (the legacy
`size_average`/`reduce` flags included) and PyTorch's state (BCELoss's weight is a
buffer, so it is in the state_dict as in PyTorch)."""

from . import losses
from .losses import _legacy_reduction
from .module import Module


class _Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction: str = "mean"):
        super().__init__()
        self.reduction = _legacy_reduction(size_average, reduce, reduction)


class BCELoss(_Loss):
    """Binary cross-entropy of probabilities (see F.binary_cross_entropy)."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction: str = "mean"):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)

    def forward(self, input, target):
        return losses.binary_cross_entropy(input, target, weight=self.weight,
                                           reduction=self.reduction)


class SmoothL1Loss(_Loss):
    """Smooth L1 loss (see F.smooth_l1_loss)."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean",
                 beta: float = 1.0):
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input, target):
        return losses.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """Huber loss (see F.huber_loss)."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        if not isinstance(delta, (float, int)):
            raise TypeError(f"delta must be a float or int, got: {type(delta)}")
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input, target):
        return losses.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class KLDivLoss(_Loss):
    """Kullback-Leibler divergence of log-probabilities (see F.kl_div)."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean",
                 log_target: bool = False):
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input, target):
        return losses.kl_div(input, target, reduction=self.reduction,
                             log_target=self.log_target)


class CosineSimilarity(Module):
    """Cosine similarity of x1 and x2 along `dim` (see F.cosine_similarity)."""

    def __init__(self, dim: int = 1, eps: float = 1e-8):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1, x2):
        return losses.cosine_similarity(x1, x2, self.dim, self.eps)
