"""`hybridnet.distributions`: probability distributions with torch.distributions' names,
signatures, defaults and semantics (see docs/distributions.md).

>>> from hybridnet.distributions import Categorical          # doctest: +SKIP
>>> m = Categorical(probs); action = m.sample()              # doctest: +SKIP
>>> loss = -m.log_prob(action) * reward                      # doctest: +SKIP

Everything differentiable is composed of hybridnet ops, so log_prob, entropy and
rsample get gradients and record and trace like any other code; random draws come from
hybridnet's global generator (`hn.manual_seed`), and a traced call that samples runs
eagerly.
"""

from . import constraints
from .bernoulli import Bernoulli
from .categorical import Categorical
from .distribution import Distribution
from .independent import Independent
from .kl import kl_divergence, register_kl
from .normal import Normal

__all__ = ["Bernoulli", "Categorical", "Distribution", "Independent", "Normal",
           "constraints", "kl_divergence", "register_kl"]
