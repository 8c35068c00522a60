"""A flat density over a vector of unconstrained coordinates (for rewritten models)."""

from __future__ import annotations

import jax.numpy as jnp
from numpyro.distributions import Distribution, constraints

__all__ = ["JointCoordinates", "MEMBER_FLAG"]

# ``msg["infer"][MEMBER_FLAG]`` marks a latent site that a rewritten model conditions
# on a slice of a joint vector: still a latent of the user's model.
MEMBER_FLAG = "autocvi_joint_member"


class JointCoordinates(Distribution):
    """A flat density over the unconstrained coordinates of a joint group.

    ``log_prob`` is 0: the members' own priors are factors of the model that
    :func:`joint_model` builds. ``sample`` returns the starting point.
    """

    arg_constraints = {}
    support = constraints.real_vector

    def __init__(self, init):
        self.init = jnp.asarray(init)
        super().__init__(batch_shape=(), event_shape=jnp.shape(self.init))

    def sample(self, key, sample_shape=()):
        return jnp.broadcast_to(self.init, tuple(sample_shape) + self.event_shape)

    def log_prob(self, value):
        return jnp.zeros(jnp.shape(value)[:-1], jnp.result_type(value))
