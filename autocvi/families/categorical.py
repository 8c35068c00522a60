"""Categorical over K classes, non-minimal logits (value ``event_ndim`` 0).

    phi(z) = (one_hot(z, K),),  lam = (logits,) (defined up to an additive constant),
    mu = (probs,),  A(lam) = logsumexp(logits),  log h(z) = 0.

Shapes: the value ``z`` is an integer index of shape ``batch``; ``lam[0]`` and
``mu[0]`` have shape ``batch + (K,)``.  Because the representation is
non-minimal, ``mean_to_natural(natural_to_mean(lam))`` returns the normalised
logits ``lam - logsumexp(lam)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp
from numpyro import distributions as dist

from .base import family_from_namespace, unwrap_distribution


def sufficient_statistics(z, num_categories=None):
    """``phi(z) = (one_hot(z, K),)``; shape ``z.shape + (K,)``.

    ``num_categories`` (K) is required: an index alone does not tell K.
    """
    if num_categories is None:
        raise ValueError(
            "Categorical.sufficient_statistics needs num_categories=K (the size of the "
            "last axis of the natural parameter)"
        )
    return (jax.nn.one_hot(z, num_categories),)


def natural_to_mean(lam):
    """``(logits,) -> (softmax(logits),)``; shape ``batch + (K,)``."""
    return (jax.nn.softmax(lam[0], axis=-1),)


def mean_to_natural(mu):
    """``(probs,) -> (log probs,)``; shape ``batch + (K,)``.

    Probabilities are clipped below at the dtype's smallest normal number so
    that the logits stay finite.
    """
    p = mu[0]
    return (jnp.log(jnp.maximum(p, jnp.finfo(p.dtype).tiny)),)


def log_partition(lam):
    """``A = logsumexp(logits)`` over the last axis; shape ``batch``."""
    return logsumexp(lam[0], axis=-1)


def log_base_measure(z):
    """``log h(z) = 0``; shape ``z.shape``."""
    return jnp.zeros(jnp.shape(z), dtype=jnp.result_type(float))


def entropy(lam):
    """``H = -sum probs log probs`` (= ``A(lam) - <probs, logits>``); shape ``batch``.

    Classes with zero probability (``-inf`` logits) contribute zero.
    """
    log_probs = jax.nn.log_softmax(lam[0], axis=-1)
    probs = jnp.exp(log_probs)
    return -jnp.sum(probs * jnp.where(probs > 0, log_probs, 0.0), axis=-1)


def sample(rng_key, lam, sample_shape=()):
    """Integer draws in ``[0, K)``; shape ``sample_shape + batch`` (not reparameterisable)."""
    logits = lam[0]
    return jax.random.categorical(
        rng_key, logits, axis=-1, shape=tuple(sample_shape) + logits.shape[:-1]
    )


def to_numpyro(lam):
    """``dist.Categorical(logits=logits)``; batch ``batch``, event ``()``."""
    return dist.Categorical(logits=lam[0])


def from_numpyro(d):
    """Logits of a (wrapped) ``CategoricalProbs``/``CategoricalLogits``.

    Returns ``(logits,)`` of shape ``d.batch_shape + d.event_shape + (K,)``.
    """
    base = unwrap_distribution(d)
    if not isinstance(base, dist.CategoricalProbs | dist.CategoricalLogits):
        raise TypeError(f"Categorical.from_numpyro expects Categorical, got {type(base).__name__}")
    logits = base.logits
    shape = tuple(d.batch_shape) + tuple(d.event_shape) + logits.shape[-1:]
    return (jnp.broadcast_to(logits, shape),)


def is_valid(lam):
    """All logits finite; bool of shape ``batch``."""
    return jnp.all(jnp.isfinite(lam[0]), axis=-1)


def moment_nodes(mu):
    """Nodes ``0..K-1`` with weights ``probs``.

    Returns integer ``nodes`` (JAX's default integer dtype, like samples and
    numpyro's values) of shape ``(K,) + batch`` and ``weights`` of shape
    ``(K,) + batch``.
    """
    probs = mu[0]
    k = probs.shape[-1]
    weights = jnp.moveaxis(probs, -1, 0)
    nodes = jnp.broadcast_to(jnp.arange(k).reshape((k,) + (1,) * (probs.ndim - 1)), weights.shape)
    return nodes, weights


def matches(d):
    """``Categorical`` by probs or logits, and subclasses (``OrderedLogistic``)."""
    return isinstance(unwrap_distribution(d), (dist.CategoricalProbs, dist.CategoricalLogits))


def reference_natural(rng_key, shape, num_categories=None):
    """A fixed valid natural parameter for draws of shape ``shape`` (random locations where
    the family has them), for the planner's structural probes: the answers must not depend
    on a particular q, only on the family's layout."""
    return (jnp.zeros(tuple(shape) + (num_categories,)),)


Categorical = family_from_namespace("Categorical", 0, globals())
