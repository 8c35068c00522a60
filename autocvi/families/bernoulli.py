"""Bernoulli, independent over every element (``event_ndim`` 0).

    phi(z) = (z,),  lam = (logit p,),  mu = (p,),  A(lam) = softplus(logit p),  log h(z) = 0.

All arrays have shape ``batch``; values are 0/1 integers of JAX's default integer
dtype (``int32``, or ``int64`` with x64), like numpyro's samples.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from numpyro import distributions as dist

from .base import family_from_namespace, unwrap_distribution


def sufficient_statistics(z):
    """``phi(z) = (z,)`` as a float array of shape ``z.shape``."""
    return (jnp.asarray(z, dtype=jnp.result_type(z, float)),)


def natural_to_mean(lam):
    """``(logit p,) -> (p,)``; shape ``batch``."""
    return (jax.nn.sigmoid(lam[0]),)


def mean_to_natural(mu):
    """``(p,) -> (log p - log(1 - p),)``; shape ``batch``.

    ``p`` is clipped to ``[tiny, 1 - eps]`` so that the logit stays finite.
    """
    p = mu[0]
    fi = jnp.finfo(p.dtype)
    p = jnp.clip(p, fi.tiny, 1.0 - fi.epsneg)
    return (jnp.log(p) - jnp.log1p(-p),)


def log_partition(lam):
    """``A = softplus(logit) = log(1 + e^logit)``; shape ``batch``."""
    return jax.nn.softplus(lam[0])


def log_base_measure(z):
    """``log h(z) = 0``; shape ``z.shape``."""
    return jnp.zeros(jnp.shape(z), dtype=jnp.result_type(float))


def entropy(lam):
    """``H = softplus(logit) - p * logit``; shape ``batch``."""
    logits = lam[0]
    return jax.nn.softplus(logits) - jax.nn.sigmoid(logits) * logits


def sample(rng_key, lam, sample_shape=()):
    """0/1 draws of the default integer dtype; shape ``sample_shape + batch`` (not reparameterisable)."""
    logits = lam[0]
    shape = tuple(sample_shape) + jnp.shape(logits)
    return jax.random.bernoulli(rng_key, jax.nn.sigmoid(logits), shape).astype(jnp.result_type(int))


def to_numpyro(lam):
    """``dist.Bernoulli(logits=logit)`` with ``batch_shape = batch``."""
    return dist.Bernoulli(logits=lam[0])


def from_numpyro(d):
    """Logits of a (wrapped) ``BernoulliProbs``/``BernoulliLogits``; shape ``d.batch_shape + d.event_shape``."""
    base = unwrap_distribution(d)
    if not isinstance(base, dist.BernoulliProbs | dist.BernoulliLogits):
        raise TypeError(f"Bernoulli.from_numpyro expects Bernoulli, got {type(base).__name__}")
    shape = tuple(d.batch_shape) + tuple(d.event_shape)
    return (jnp.broadcast_to(base.logits, shape),)


def is_valid(lam):
    """Logit finite; bool of shape ``batch``."""
    return jnp.isfinite(lam[0])


def moment_nodes(mu):
    """Nodes ``0, 1`` (default integer dtype, like samples) with weights ``1 - p, p``.

    Both have shape ``(2,) + batch``.
    """
    p = mu[0]
    weights = jnp.stack([1.0 - p, p])
    nodes = jnp.broadcast_to(jnp.arange(2).reshape((2,) + (1,) * p.ndim), weights.shape)
    return nodes, weights


def matches(d):
    """``Bernoulli`` by probs or logits."""
    return isinstance(unwrap_distribution(d), (dist.BernoulliProbs, dist.BernoulliLogits))


def reference_natural(rng_key, shape, num_categories=None):
    """A fixed valid natural parameter for draws of shape ``shape`` (random locations where
    the family has them), for the planner's structural probes: the answers must not depend
    on a particular q, only on the family's layout."""
    return (jnp.zeros(shape),)


Bernoulli = family_from_namespace("Bernoulli", 0, globals())
