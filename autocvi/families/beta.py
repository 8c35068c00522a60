"""Beta(a, b), independent over every element (``event_ndim`` 0).

    phi(z) = (log z, log(1 - z)),  lam = (a - 1, b - 1),
    mu = (psi(a) - psi(a + b), psi(b) - psi(a + b)),
    A(lam) = lgamma(a) + lgamma(b) - lgamma(a + b),  log h(z) = 0.

All arrays have shape ``batch``.  numpyro's ``Beta(concentration1, concentration0)``
has ``a = concentration1``, ``b = concentration0``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import digamma, gammaln
from numpyro import distributions as dist

from .base import family_from_namespace, unwrap_distribution
from .dirichlet import solve_dirichlet


def _ab(lam):
    return lam[0] + 1.0, lam[1] + 1.0


def sufficient_statistics(z):
    """``phi(z) = (log z, log(1 - z))``; each of shape ``z.shape``."""
    return (jnp.log(z), jnp.log1p(-z))


def natural_to_mean(lam):
    """``(a - 1, b - 1) -> (psi(a) - psi(a+b), psi(b) - psi(a+b))``; shapes ``batch``."""
    a, b = _ab(lam)
    psi_ab = digamma(a + b)
    return (digamma(a) - psi_ab, digamma(b) - psi_ab)


def mean_to_natural(mu):
    """``(E log z, E log(1-z)) -> (a - 1, b - 1)``; shapes ``batch``.

    Inverts the digamma system with ``dirichlet.solve_dirichlet`` (K = 2):
    fixed-iteration bisection plus Newton, differentiable through a final
    Newton step; accurate to ~1e-10 relative in float64 for reasonable
    ``a, b`` (about [1e-2, 1e4]).
    """
    m0, m1 = jnp.broadcast_arrays(*mu)
    alpha = solve_dirichlet(jnp.stack([m0, m1], axis=-1))
    return (alpha[..., 0] - 1.0, alpha[..., 1] - 1.0)


def log_partition(lam):
    """``A = lgamma(a) + lgamma(b) - lgamma(a + b)``; shape ``batch``."""
    a, b = _ab(lam)
    return gammaln(a) + gammaln(b) - gammaln(a + b)


def log_base_measure(z):
    """``log h(z) = 0``; shape ``z.shape``."""
    return jnp.zeros(jnp.shape(z), dtype=jnp.result_type(z, float))


def entropy(lam):
    """``H = A(lam) - (a-1) E log z - (b-1) E log(1-z)``; shape ``batch``."""
    m0, m1 = natural_to_mean(lam)
    return log_partition(lam) - lam[0] * m0 - lam[1] * m1


def sample(rng_key, lam, sample_shape=()):
    """Reparameterised draw (``jax.random.beta``); shape ``sample_shape + batch``."""
    a, b = jnp.broadcast_arrays(*_ab(lam))
    return jax.random.beta(rng_key, a, b, tuple(sample_shape) + a.shape, dtype=a.dtype)


def to_numpyro(lam):
    """``dist.Beta(a, b)`` with ``batch_shape = batch``."""
    a, b = _ab(lam)
    return dist.Beta(a, b)


def from_numpyro(d):
    """Natural parameters of a (wrapped) ``dist.Beta``; shapes ``d.batch_shape + d.event_shape``."""
    base = unwrap_distribution(d)
    shape = tuple(d.batch_shape) + tuple(d.event_shape)
    if _is_unit_uniform(base):  # Beta(1, 1)
        zero = jnp.zeros(shape, jnp.result_type(base.low, float))
        return (zero, zero)
    if not isinstance(base, dist.Beta):
        raise TypeError(
            f"Beta.from_numpyro expects Beta or Uniform(0, 1), got {type(base).__name__}"
        )
    return (
        jnp.broadcast_to(base.concentration1 - 1.0, shape),
        jnp.broadcast_to(base.concentration0 - 1.0, shape),
    )


def _is_unit_uniform(d) -> bool:
    """``Uniform(0, 1)`` with concrete bounds (``Beta(1, 1)``: a flat prior on a
    probability, as users write it). Bounds that are traced values cannot be read
    here, and other bounds are not a Beta: both stay with their own q."""
    if not isinstance(d, dist.Uniform):
        return False
    try:
        return bool(np.all(np.asarray(d.low) == 0.0) and np.all(np.asarray(d.high) == 1.0))
    except jax.errors.ConcretizationTypeError:
        return False


def is_valid(lam):
    """``a > 0`` and ``b > 0`` (both ``lam > -1``) and finite; bool of shape ``batch``."""
    return (lam[0] > -1.0) & (lam[1] > -1.0) & jnp.isfinite(lam[0]) & jnp.isfinite(lam[1])


def moment_nodes(mu):
    """Two nodes: the roots of ``p^2 - s p + P = 0``, weights 1/2.

    ``P = exp(2 E log z)`` is the nodes' product and ``Q = (1 - p1)(1 - p2) =
    exp(2 E log(1-z))`` fixes ``s = 1 + P - Q``, so functions affine in
    ``(log z, log(1-z))`` have their exact expectation.  To avoid cancellation
    the node near 0 is ``P / p_large`` and the node near 1 is ``1 - Q / q_large``
    (``q = 1 - p`` solves ``q^2 - (1 + Q - P) q + Q = 0``, same discriminant).
    A node close to 1 still holds ``1 - z`` only to absolute precision
    ``eps``: for small ``b`` (e.g. ``a = 16, b = 0.1``: ``1 - z ~ 3e-10``)
    ``E log(1-z)`` is reproduced to ~1e-7 in float64.  Returns ``nodes`` and
    ``weights`` of shape ``(2,) + batch``.
    """
    m0, m1 = jnp.broadcast_arrays(*mu)
    prod_p = jnp.exp(2.0 * m0)
    prod_q = jnp.exp(2.0 * m1)
    sum_p = prod_p - jnp.expm1(2.0 * m1)  # 1 + P - Q
    sum_q = prod_q - jnp.expm1(2.0 * m0)  # 1 + Q - P
    r = jnp.sqrt(jnp.maximum(sum_p * sum_p - 4.0 * prod_p, 0.0))
    lo = prod_p / (0.5 * (sum_p + r))
    hi = 1.0 - prod_q / (0.5 * (sum_q + r))
    nodes = jnp.stack([lo, hi])
    weights = jnp.full_like(nodes, 0.5)
    return nodes, weights


def matches(d):
    """``Beta`` and its subclasses (``BetaProportion``), and ``Uniform(0, 1)`` (``Beta(1, 1)``)."""
    base = unwrap_distribution(d)
    return isinstance(base, dist.Beta) or _is_unit_uniform(base)


def reference_natural(rng_key, shape, num_categories=None):
    """A fixed valid natural parameter for draws of shape ``shape`` (random locations where
    the family has them), for the planner's structural probes: the answers must not depend
    on a particular q, only on the family's layout."""
    return (jnp.ones(shape), jnp.ones(shape))


Beta = family_from_namespace("Beta", 0, globals())
