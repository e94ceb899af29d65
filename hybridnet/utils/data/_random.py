"""Where hybridnet.utils.data draws random numbers: a given numpy.random.Generator, or
hybridnet's global generator (seeded by hn.manual_seed)."""

import numpy as np

from ... import creation


def _check_generator(generator, who: str):
    if generator is None or isinstance(generator, np.random.Generator):
        return generator
    raise TypeError(f"{who}: generator must be a numpy.random.Generator (e.g. "
                    f"np.random.default_rng(0)) or None for hybridnet's global generator "
                    f"(seeded by hn.manual_seed); got {type(generator).__name__}")


def _rng(generator) -> np.random.Generator:
    """The generator to draw from: the given one, else hybridnet's global one (looked up
    at each draw, so a later hn.manual_seed takes effect)."""
    return creation.generator() if generator is None else generator
