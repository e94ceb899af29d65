"""A NumPy port of the classic CartPole-v1 environment (gym/gymnasium's equations), so the
reinforcement-learning examples run without gym.

    env = make("CartPole-v1")
    obs = env.reset(seed=0)          # float32[4]: cart position, cart velocity,
    obs, reward, terminated, truncated, info = env.step(1)   # pole angle, pole velocity

The dynamics are gym's `CartPoleEnv.step` with the default "euler" integrator: gravity
9.8, cart mass 1.0, pole mass 0.1, half pole length 0.5, force 10 (action 1 pushes right,
0 left), 0.02 s per step. An episode terminates when |x| > 2.4 or |theta| > 12 degrees
and is truncated after 500 steps (gym's TimeLimit wrapper of CartPole-v1); every step
gives reward 1, including the one that terminates. `reset` draws the state uniformly
from [-0.05, 0.05]^4 with a NumPy Generator seeded as gymnasium seeds its own
(`np.random.default_rng(seed)`), so `reset(seed=s)` starts where gymnasium's does.
(Unlike gymnasium, `reset` returns the observation alone, not `(obs, info)`.)
"""

import math
import warnings
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EnvSpec:
    """The registration facts gym keeps in `env.spec`."""

    id: str = "CartPole-v1"
    max_episode_steps: int = 500
    reward_threshold: float = 475.0


class CartPole:
    """CartPole-v1: balance a pole on a cart by pushing the cart left or right."""

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5  # half the pole's length
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02  # seconds between state updates
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4
    observation_size = 4
    num_actions = 2

    def __init__(self, max_episode_steps: int = 500):
        self.spec = EnvSpec(max_episode_steps=max_episode_steps)
        self.np_random = np.random.default_rng()
        self.state = None
        self.steps_beyond_terminated = None
        self.elapsed_steps = 0

    def reset(self, seed=None) -> np.ndarray:
        """Start an episode; `seed` reseeds the environment's generator first."""
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        self.state = self.np_random.uniform(low=-0.05, high=0.05, size=(4,))
        self.steps_beyond_terminated = None
        self.elapsed_steps = 0
        return np.array(self.state, dtype=np.float32)

    def step(self, action):
        """Push the cart (action 1: right, 0: left) for one time step.
        Returns (obs, reward, terminated, truncated, info)."""
        if self.state is None:
            raise RuntimeError("CartPole: call reset() before step()")
        action = int(action)
        if action not in (0, 1):
            raise ValueError(f"CartPole: action must be 0 or 1, got {action!r}")
        x, x_dot, theta, theta_dot = self.state
        force = self.force_mag if action == 1 else -self.force_mag
        costheta = math.cos(theta)
        sintheta = math.sin(theta)
        # https://coneural.org/florian/papers/05_cart_pole.pdf, as gym computes it
        temp = (force + self.polemass_length * theta_dot**2 * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta**2 / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        # euler integration (gym's default kinematics_integrator)
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        self.state = np.array((x, x_dot, theta, theta_dot), dtype=np.float64)

        terminated = bool(x < -self.x_threshold or x > self.x_threshold
                          or theta < -self.theta_threshold_radians
                          or theta > self.theta_threshold_radians)
        if not terminated:
            reward = 1.0
        elif self.steps_beyond_terminated is None:
            self.steps_beyond_terminated = 0  # the pole just fell
            reward = 1.0
        else:
            if self.steps_beyond_terminated == 0:
                warnings.warn("CartPole: step() called after the episode terminated; "
                              "call reset() first (reward 0 from now on)", stacklevel=2)
            self.steps_beyond_terminated += 1
            reward = 0.0
        self.elapsed_steps += 1
        truncated = self.elapsed_steps >= self.spec.max_episode_steps
        return np.array(self.state, dtype=np.float32), reward, terminated, truncated, {}


def make(env_id: str = "CartPole-v1") -> CartPole:
    """`gym.make` for the one environment this module has."""
    if env_id != "CartPole-v1":
        raise ValueError(f"only CartPole-v1 is available here, got {env_id!r}")
    return CartPole()
