"""Univariate Normal, independent over every element of a site (``event_ndim`` 0).

    phi(z) = (z, z^2),  lam = (m / v, -1 / (2 v)),  mu = (m, m^2 + v),
    A(lam) = -lam1^2 / (4 lam2) - log(-2 lam2) / 2,  log h(z) = -log(2 pi) / 2.

All arrays have shape ``batch`` (the site's full value shape).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from numpyro import distributions as dist

from .base import family_from_namespace, unwrap_distribution

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def sufficient_statistics(z):
    """``phi(z) = (z, z^2)``; each of shape ``z.shape``."""
    return (z, z * z)


def _mean_var(lam):
    eta1, eta2 = lam
    v = -0.5 / eta2
    return eta1 * v, v


def natural_to_mean(lam):
    """``(m/v, -1/(2v)) -> (m, m^2 + v)``; shapes ``batch``."""
    m, v = _mean_var(lam)
    return (m, m * m + v)


def mean_to_natural(mu):
    """``(m, m^2 + v) -> (m/v, -1/(2v))``; shapes ``batch``."""
    m, mu2 = mu
    v = mu2 - m * m
    return (m / v, -0.5 / v)


def log_partition(lam):
    """``A(lam) = -lam1^2/(4 lam2) - log(-2 lam2)/2``; shape ``batch``."""
    eta1, eta2 = lam
    return -0.25 * eta1 * eta1 / eta2 - 0.5 * jnp.log(-2.0 * eta2)


def log_base_measure(z):
    """``log h(z) = -log(2 pi)/2``; shape ``z.shape``."""
    return jnp.full(jnp.shape(z), -_HALF_LOG_2PI, dtype=jnp.result_type(z, float))


def entropy(lam):
    """``H = log(2 pi e v)/2``; shape ``batch``."""
    _, v = _mean_var(lam)
    return 0.5 * jnp.log(v) + _HALF_LOG_2PI + 0.5


def sample(rng_key, lam, sample_shape=()):
    """Reparameterised draw ``m + sqrt(v) eps``; shape ``sample_shape + batch``."""
    m, v = _mean_var(lam)
    m, v = jnp.broadcast_arrays(m, v)
    eps = jax.random.normal(rng_key, tuple(sample_shape) + m.shape, dtype=m.dtype)
    return m + jnp.sqrt(v) * eps


def to_numpyro(lam):
    """``dist.Normal(m, sqrt(v))`` with ``batch_shape = batch``."""
    m, v = _mean_var(lam)
    return dist.Normal(m, jnp.sqrt(v))


def from_numpyro(d):
    """Natural parameters of a (possibly expanded/independent/masked) ``dist.Normal``.

    Returns ``lam`` with shapes ``d.batch_shape + d.event_shape``.
    """
    base = unwrap_distribution(d)
    if not isinstance(base, dist.Normal):
        raise TypeError(f"Normal.from_numpyro expects a numpyro Normal, got {type(base).__name__}")
    shape = tuple(d.batch_shape) + tuple(d.event_shape)
    v = jnp.broadcast_to(base.scale**2, shape)
    m = jnp.broadcast_to(base.loc, shape)
    return (m / v, -0.5 / v)


def is_valid(lam):
    """``lam2 < 0`` and both finite; bool of shape ``batch``."""
    eta1, eta2 = lam
    return (eta2 < 0) & jnp.isfinite(eta1) & jnp.isfinite(eta2)


def domain_preserving_step(lam, target, beta):
    """A step from ``lam`` towards ``target`` whose precision stays positive.

    The plain CVI step ``(1 - b) lam + b target`` moves the precision to
    ``(1 - b) S + b S_t``; when the target precision ``S_t`` (minus twice the
    summed second components of the messages: an expected negative Hessian)
    is negative, as for a non-log-concave factor or a start far in the tails,
    no useful ``b`` keeps it positive. This step uses ``|S_t|`` instead (the
    saddle-free Newton curvature of Dauphin et al., "Identifying and
    attacking the saddle point problem in high-dimensional non-convex
    optimization", NeurIPS 2014) and moves the mean by ``b S_new^{-1} g``,
    with ``g = t1 - S_t m`` the expected gradient, exactly as the plain step
    does. Where ``S_t > 0`` it is the plain step; fixed points with a
    positive target precision are unchanged.
    """
    eta1, eta2 = lam
    t1, t2 = target
    prec = -2.0 * eta2
    m = eta1 / prec
    prec_t = -2.0 * t2
    grad = t1 - prec_t * m
    prec_new = (1.0 - beta) * prec + beta * jnp.abs(prec_t)
    return (prec_new * m + beta * grad, -0.5 * prec_new)


def moment_nodes(mu):
    """Two nodes ``m -+ sqrt(v)`` with weights 1/2 (exact for functions affine in ``phi``).

    Returns ``nodes`` of shape ``(2,) + batch`` and ``weights`` of shape ``(2,) + batch``.
    """
    m, mu2 = jnp.broadcast_arrays(*mu)
    return moment_nodes_at(m, mu2 - m * m)


def moment_nodes_at(m, var):
    """:func:`moment_nodes` of the q with mean ``m`` and variance ``var``."""
    m, var = jnp.broadcast_arrays(m, var)
    s = jnp.sqrt(jnp.maximum(var, 0.0))
    nodes = jnp.stack([m - s, m + s])
    weights = jnp.full_like(nodes, 0.5)
    return nodes, weights


def matches(d):
    """A ``Normal`` with no event dimensions (elementwise)."""
    return isinstance(unwrap_distribution(d), dist.Normal) and len(d.event_shape) == 0


def reference_natural(rng_key, shape, num_categories=None):
    """A fixed valid natural parameter for draws of shape ``shape`` (random locations where
    the family has them), for the planner's structural probes: the answers must not depend
    on a particular q, only on the family's layout."""
    return (jax.random.normal(rng_key, shape), -0.5 * jnp.ones(shape))


Normal = family_from_namespace("Normal", 0, globals())
