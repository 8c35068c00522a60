"""Multivariate Normal with full covariance over the last axis (``event_ndim`` 1).

    phi(z) = (z, z z^T),  lam = (P m, -P / 2) with P = S^{-1},  mu = (m, S + m m^T),
    A(lam) = lam1^T P^{-1} lam1 / 2 - log det P / 2,  log h(z) = -D log(2 pi) / 2.

Shapes: ``lam[0]``, ``mu[0]``: ``batch + (D,)``; ``lam[1]``, ``mu[1]``:
``batch + (D, D)``.  ``lam[1]`` is symmetrised before use, so the gradient of
``A`` w.r.t. it is the symmetric ``S + m m^T``.  Inverses are computed with
Cholesky solves.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from numpyro import distributions as dist

from .base import cho_solve, family_from_namespace, symmetrize, unwrap_distribution

_LOG_2PI = math.log(2.0 * math.pi)


def _eye_like(a):
    return jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)


def _logdet_from_chol(chol):
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)


def sufficient_statistics(z):
    """``phi(z) = (z, z z^T)``: shapes ``batch + (D,)`` and ``batch + (D, D)``."""
    return (z, z[..., :, None] * z[..., None, :])


def _precision_chol(lam):
    eta1, eta2 = lam
    prec = -2.0 * symmetrize(eta2)
    return eta1, prec, jnp.linalg.cholesky(prec)


def precision_to_moments(eta1, prec, xp=jnp):
    """``(m, S)`` of the Gaussian with precision ``P`` and ``eta1 = P m`` (``xp``:
    ``jax.numpy`` or ``numpy``), accurate in float32 where ``P`` is ill-conditioned.

    ``P`` is scaled to unit diagonal (``P = D R D``) and factored, ``R = L L^T``; ``m``
    comes from two triangular solves and ``S = D^-1 L^-T L^-1 D^-1`` from the product of
    the triangular inverse with itself. Not ``inv(P) @ eta1``: ``eta1`` is large where
    ``P`` is (``P m``), and the inverse's rounding, about ``eps cond(P)`` of its largest
    entries, multiplies it. A Poisson GLM with group intercepts (3,000 counts near
    1,100: ``P`` ~ 3e5 along ``b0 + u_g``, ~10 across) read its predictors' means 19 sd
    off in float32: every line-search candidate's ELBO was noise (-3e4, -9e28, -6e5 for
    nearby step sizes), every step was refused and q stopped 8,000 nats below the
    float64 fit."""
    m, unit_cov, d = _unit_moments(eta1, prec, xp)
    return m, unit_cov / (d[..., :, None] * d[..., None, :])


def _unit_moments(eta1, prec, xp=jnp):
    """``(m, R^-1, d)`` with ``P = D R D``, ``D = diag(d)``: :func:`precision_to_moments`
    before the covariance is scaled back (``S = D^-1 R^-1 D^-1``)."""
    d = xp.sqrt(xp.diagonal(prec, axis1=-2, axis2=-1))
    unit = prec / (d[..., :, None] * d[..., None, :])
    chol = xp.linalg.cholesky(unit)
    if xp is jnp:
        chol_inv = jax.scipy.linalg.solve_triangular(chol, _eye_like(unit), lower=True)
        m = cho_solve(chol, eta1 / d)
    else:  # numpy has no triangular solve; its general ones are as accurate here
        chol_inv = xp.linalg.inv(chol)
        half = xp.linalg.solve(chol, (eta1 / d)[..., None])
        m = xp.linalg.solve(xp.swapaxes(chol, -1, -2), half)[..., 0]
    unit_cov = xp.einsum("...ki,...kj->...ij", chol_inv, chol_inv)
    unit_cov = 0.5 * (unit_cov + xp.swapaxes(unit_cov, -1, -2))  # symmetric to the bit
    return m / d, unit_cov, d


def _mean_cov(lam):
    eta1, prec = lam[0], -2.0 * symmetrize(lam[1])
    m, cov = precision_to_moments(eta1, prec)
    return m, cov


def natural_to_mean(lam):
    """``(P m, -P/2) -> (m, S + m m^T)``; shapes ``batch + (D,)``, ``batch + (D, D)``."""
    m, cov = _mean_cov(lam)
    return (m, cov + m[..., :, None] * m[..., None, :])


def mean_to_natural(mu):
    """``(m, S + m m^T) -> (S^{-1} m, -S^{-1}/2)`` via a Cholesky factor of ``S``."""
    m, mu2 = mu
    cov = symmetrize(mu2 - m[..., :, None] * m[..., None, :])
    chol = jnp.linalg.cholesky(cov)
    eta1 = cho_solve(chol, m)
    prec = symmetrize(cho_solve(chol, _eye_like(cov)))
    return (eta1, -0.5 * prec)


def log_partition(lam):
    """``A(lam) = lam1^T P^{-1} lam1 / 2 - log det P / 2`` with ``P = -2 lam2``; shape ``batch``."""
    eta1, _, chol_p = _precision_chol(lam)
    m = cho_solve(chol_p, eta1)
    return 0.5 * jnp.sum(eta1 * m, axis=-1) - 0.5 * _logdet_from_chol(chol_p)


def log_base_measure(z):
    """``log h(z) = -D log(2 pi) / 2``; shape ``z.shape[:-1]``."""
    d = z.shape[-1]
    return jnp.full(z.shape[:-1], -0.5 * d * _LOG_2PI, dtype=jnp.result_type(z, float))


def entropy(lam):
    """``H = D (1 + log 2 pi) / 2 - log det P / 2``; shape ``batch``."""
    eta1, _, chol_p = _precision_chol(lam)
    d = eta1.shape[-1]
    return 0.5 * d * (1.0 + _LOG_2PI) - 0.5 * _logdet_from_chol(chol_p)


def sample(rng_key, lam, sample_shape=()):
    """Reparameterised draw ``m + L eps`` with ``L L^T = S``; shape ``sample_shape + batch + (D,)``."""
    m, cov = _mean_cov(lam)
    chol = jnp.linalg.cholesky(cov)
    batch = jnp.broadcast_shapes(m.shape[:-1], chol.shape[:-2])
    shape = tuple(sample_shape) + batch + m.shape[-1:]
    eps = jax.random.normal(rng_key, shape, dtype=m.dtype)
    return m + jnp.einsum("...ij,...j->...i", chol, eps)


def to_numpyro(lam):
    """``dist.MultivariateNormal(m, scale_tril=L)``, ``L L^T = P^-1``; batch ``batch``,
    event ``(D,)``.

    Factored after scaling P to unit diagonal (``P = S R S``, ``S = diag(P)^1/2``; then
    ``L = S^-1 chol(R^-1)``): Cholesky factors are insensitive to that scaling, the
    eigenvalues NumPyro's ``precision_matrix`` validation checks are not. A logistic
    regression on age and income in dollars has a precision with entries from 1 to 1e11:
    positive definite in float32 as R, "invalid precision_matrix" as P."""
    m, unit_cov, s = _unit_moments(lam[0], -2.0 * symmetrize(lam[1]))
    return dist.MultivariateNormal(m, scale_tril=jnp.linalg.cholesky(unit_cov) / s[..., :, None])


def from_numpyro(d):
    """Natural parameters of a ``dist.MultivariateNormal`` or of a ``dist.Normal`` with one event dim.

    Accepts ``ExpandedDistribution`` / ``Independent`` / ``MaskedDistribution``
    wrappers.  A ``Normal(...).to_event(1)`` gives a diagonal precision.
    Returns ``(batch + (D,), batch + (D, D))`` with
    ``batch + (D,) = d.batch_shape + d.event_shape``.
    """
    base = unwrap_distribution(d)
    shape = tuple(d.batch_shape) + tuple(d.event_shape)
    if isinstance(base, dist.MultivariateNormal):
        chol = base.scale_tril
        eta1 = cho_solve(chol, base.loc)
        prec = symmetrize(cho_solve(chol, _eye_like(chol)))
        eta1 = jnp.broadcast_to(eta1, shape)
        prec = jnp.broadcast_to(prec, shape + shape[-1:])
        return (eta1, -0.5 * prec)
    if isinstance(base, dist.Normal):
        if len(d.event_shape) != 1:
            raise ValueError(
                "MultivariateNormal.from_numpyro needs a Normal with exactly one event "
                f"dimension, got event_shape {d.event_shape}"
            )
        inv_v = jnp.broadcast_to(1.0 / base.scale**2, shape)
        m = jnp.broadcast_to(base.loc, shape)
        eye = jnp.eye(shape[-1], dtype=inv_v.dtype)
        return (m * inv_v, -0.5 * inv_v[..., :, None] * eye)
    raise TypeError(
        f"MultivariateNormal.from_numpyro expects MultivariateNormal or Normal, got {type(base).__name__}"
    )


def is_valid(lam):
    """``-lam2`` positive definite (finite Cholesky) and ``lam1`` finite; bool of shape ``batch``."""
    eta1, _, chol_p = _precision_chol(lam)
    ok_chol = jnp.all(jnp.isfinite(chol_p), axis=(-2, -1))
    ok_diag = jnp.all(jnp.diagonal(chol_p, axis1=-2, axis2=-1) > 0, axis=-1)
    return ok_chol & ok_diag & jnp.all(jnp.isfinite(eta1), axis=-1)


def domain_preserving_step(lam, target, beta):
    """A step from ``lam`` towards ``target`` whose precision stays positive definite.

    As the Normal family's (see there): the target precision ``P_t`` is
    replaced by ``|P_t|`` (its eigenvalues' absolute values: the
    saddle-free Newton curvature of Dauphin et al., "Identifying and
    attacking the saddle point problem in high-dimensional non-convex
    optimization", NeurIPS 2014), ``P_new = (1 - b) P + b |P_t|``, and the
    mean moves by ``b P_new^{-1} g`` with ``g = t1 - P_t m`` the expected
    gradient. Where ``P_t`` is positive definite this is the plain step.
    """
    eta1, prec, chol_p = _precision_chol(lam)
    m = cho_solve(chol_p, eta1)
    t1, t2 = target
    prec_t = -2.0 * symmetrize(t2)
    grad = t1 - jnp.einsum("...ij,...j->...i", prec_t, m)
    evals, evecs = jnp.linalg.eigh(prec_t)
    abs_t = jnp.einsum("...ik,...k,...jk->...ij", evecs, jnp.abs(evals), evecs)
    b = jnp.reshape(beta, jnp.shape(beta) + (1, 1))
    prec_new = symmetrize((1.0 - b) * prec + b * abs_t)
    eta1_new = jnp.einsum("...ij,...j->...i", prec_new, m) + b[..., 0] * grad
    return (eta1_new, -0.5 * prec_new)


def moment_nodes(mu):
    """Sigma points ``m +- sqrt(D) L e_j`` (``L L^T = S``), weights ``1/(2D)``.

    Returns ``nodes`` of shape ``(2D,) + batch + (D,)`` and ``weights`` of shape
    ``(2D,) + batch``.  ``S = mu2 - m m^T``.
    """
    m, mu2 = mu
    return moment_nodes_at(m, mu2 - m[..., :, None] * m[..., None, :])


def moment_nodes_at(m, cov):
    """:func:`moment_nodes` of the q with mean ``m`` and covariance ``cov`` (symmetrised
    before the Cholesky)."""
    d = m.shape[-1]
    chol = jnp.linalg.cholesky(symmetrize(cov))
    batch = jnp.broadcast_shapes(m.shape[:-1], chol.shape[:-2])
    m = jnp.broadcast_to(m, batch + (d,))
    cols = math.sqrt(d) * jnp.moveaxis(jnp.broadcast_to(chol, batch + (d, d)), -1, 0)
    nodes = jnp.concatenate([m[None] + cols, m[None] - cols], axis=0)
    weights = jnp.full((2 * d,) + batch, 1.0 / (2 * d), dtype=nodes.dtype)
    return nodes, weights


def matches(d):
    """A ``MultivariateNormal``, or a ``Normal`` with one event dimension (``.to_event(1)``)."""
    base = unwrap_distribution(d)
    if isinstance(base, dist.Normal):
        return len(d.event_shape) == 1
    return isinstance(base, dist.MultivariateNormal)


def reference_natural(rng_key, shape, num_categories=None):
    """A fixed valid natural parameter for draws of shape ``shape`` (random locations where
    the family has them), for the planner's structural probes: the answers must not depend
    on a particular q, only on the family's layout."""
    d = shape[-1]
    prec = jnp.broadcast_to(jnp.eye(d), tuple(shape) + (d,))
    return (jax.random.normal(rng_key, shape), -0.5 * prec)


MultivariateNormal = family_from_namespace("MultivariateNormal", 1, globals())
