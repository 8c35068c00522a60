"""InverseGamma(concentration a, rate b), independent over every element (``event_ndim`` 0).

The distribution of ``1 / w`` for ``w ~ Gamma(a, b)`` (numpyro's ``rate`` b is the
textbook *scale* of the inverse gamma):

    phi(z) = (log z, 1/z),  lam = (-(a + 1), -b),  mu = (log b - psi(a), a / b),
    A(lam) = lgamma(a) - a log b,  log h(z) = 0.

It is the conjugate family of a variance: ``Normal(m, sqrt(s2))`` is, as a function of
``s2``, ``-1/2 log s2 - (y - m)^2 / (2 s2)``, linear in ``phi(s2)``. So a model written
with ``sigma2 ~ InverseGamma`` gets its exact VMP update (Winn & Bishop 2005, "Variational
Message Passing", Sec. 3; the CVI paper's conjugate case, Khan & Lin 2017,
"Conjugate-Computation Variational Inference", Eq. 8) instead of a Gaussian on
``log s2``, whose light tails miss the variance's skew when there are few data.

All arrays have shape ``batch``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import digamma, gammaln
from numpyro import distributions as dist

from .base import family_from_namespace, unwrap_distribution
from .gamma import (
    log_base_measure,  # noqa: F401 - h(z) = 1 too; read by family_from_namespace
    log_normaliser,
    solve_shape,
)
from .gamma import moment_nodes as _gamma_moment_nodes


def _shape_rate(lam):
    return -lam[0] - 1.0, -lam[1]


def sufficient_statistics(z):
    """``phi(z) = (log z, 1/z)``; each of shape ``z.shape``."""
    return (jnp.log(z), 1.0 / z)


def natural_to_mean(lam):
    """``(-(a + 1), -b) -> (log b - psi(a), a / b)``; shapes ``batch``."""
    a, b = _shape_rate(lam)
    return (jnp.log(b) - digamma(a), a / b)


def mean_to_natural(mu):
    """``(E log z, E 1/z) -> (-(a + 1), -b)``; shapes ``batch``.

    ``1/z`` is Gamma(a, b), so ``log a - psi(a) = log E[1/z] + E log z`` (solved by the
    Gamma family's ``solve_shape``), then ``b = a / E[1/z]``.  Needs
    ``E[1/z] > exp(-E log z)`` (Jensen); otherwise NaN.
    """
    elog, einv = mu
    a = solve_shape(jnp.log(einv) + elog)
    return (-a - 1.0, -a / einv)


def log_partition(lam):
    """``A(lam) = lgamma(a) - a log b``; shape ``batch``."""
    return log_normaliser(*_shape_rate(lam))


def entropy(lam):
    """``H = a + log b + lgamma(a) - (1 + a) psi(a)``; shape ``batch``."""
    a, b = _shape_rate(lam)
    return a + jnp.log(b) + gammaln(a) - (1.0 + a) * digamma(a)


def sample(rng_key, lam, sample_shape=()):
    """``b / g`` with ``g ~ Gamma(a, 1)`` (implicit reparameterisation); shape ``sample_shape + batch``."""
    a, b = jnp.broadcast_arrays(*_shape_rate(lam))
    g = jax.random.gamma(rng_key, a, tuple(sample_shape) + a.shape, dtype=a.dtype)
    return b / g


def to_numpyro(lam):
    """``dist.InverseGamma(a, b)`` with ``batch_shape = batch``."""
    a, b = _shape_rate(lam)
    return dist.InverseGamma(a, b)


def from_numpyro(d):
    """Natural parameters of a (wrapped) ``dist.InverseGamma``; shapes ``d.batch_shape + d.event_shape``."""
    base = unwrap_distribution(d)
    if not isinstance(base, dist.InverseGamma):
        raise TypeError(
            f"InverseGamma.from_numpyro expects InverseGamma, got {type(base).__name__}"
        )
    shape = tuple(d.batch_shape) + tuple(d.event_shape)
    a, b = base.concentration, base.rate
    return (jnp.broadcast_to(-a - 1.0, shape), jnp.broadcast_to(-b, shape))


def is_valid(lam):
    """``a > 0`` and ``b > 0`` (``lam[0] < -1``, ``lam[1] < 0``); bool of shape ``batch``."""
    return (lam[0] < -1.0) & (lam[1] < 0.0) & jnp.isfinite(lam[0]) & jnp.isfinite(lam[1])


def moment_nodes(mu):
    """Two nodes, weights 1/2: the reciprocals of the Gamma family's nodes for ``1/z``.

    Their mean of ``1/z`` is ``E[1/z]`` and their mean of ``log z`` is ``E log z``, so any
    function affine in ``(log z, 1/z)`` has its exact expectation.
    Returns ``nodes`` and ``weights`` of shape ``(2,) + batch``.
    """
    elog, einv = mu
    inv_nodes, weights = _gamma_moment_nodes((-elog, einv))
    return 1.0 / inv_nodes, weights


def matches(d):
    """``InverseGamma`` (numpyro's ``TransformedDistribution`` of a Gamma under ``x -> 1/x``)."""
    return isinstance(unwrap_distribution(d), dist.InverseGamma)


def reference_natural(rng_key, shape, num_categories=None):
    """A fixed valid natural parameter (a = 1, b = 1) for draws of shape ``shape``, for the
    planner's structural probes."""
    return (-2.0 * jnp.ones(shape), -jnp.ones(shape))


InverseGamma = family_from_namespace("InverseGamma", 0, globals())
