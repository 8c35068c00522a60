"""The ``Family`` record and small helpers shared by the family modules.

An exponential family is written (Khan & Lin 2017, "Conjugate-Computation
Variational Inference", Sec. 2 and App. C, ``papers/004_*``)

    q(z | lam) = h(z) exp(<phi(z), lam> - A(lam)),      mu = E_q[phi(z)] = grad A(lam).

A family is a record of pure JAX functions over tuples of arrays (pytrees),
batched over arbitrary leading batch dimensions.  The layouts of ``lam`` and
``mu`` for every family are fixed in ``docs/internals.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular
from numpyro import distributions as dist
from numpyro.distributions.distribution import (
    ExpandedDistribution,
    Independent,
    MaskedDistribution,
)

__all__ = [
    "Family",
    "family_from_namespace",
    "unwrap_distribution",
    "cho_solve",
    "symmetrize",
    "trigamma",
]


class Family(NamedTuple):
    """An exponential family as a record of pure functions (see ``docs/internals.md``).

    Shapes: ``batch`` are leading (plate) dimensions, ``event`` are the
    ``event_ndim`` trailing dimensions of one value ``z``.
    """

    name: str  # "Normal", "MultivariateNormal", "Gamma", "InverseGamma", "Beta", "Dirichlet", "Categorical", "Bernoulli"
    event_ndim: int  # 0: one family per array element; 1: the last axis is one event
    sufficient_statistics: Callable  # phi(z) -> tuple of arrays
    natural_to_mean: Callable  # lam -> mu   (tuples, same structure)
    mean_to_natural: Callable  # mu  -> lam
    log_partition: Callable  # lam -> A(lam), shape batch
    log_base_measure: Callable  # z -> log h(z), shape batch
    entropy: Callable  # lam -> H[q], shape batch
    sample: Callable  # (rng_key, lam, sample_shape=()) -> z, shape sample_shape + batch + event
    to_numpyro: Callable  # lam -> numpyro Distribution (batch_shape = batch, event_shape = event)
    from_numpyro: Callable  # numpyro Distribution of the matching type -> lam
    is_valid: Callable  # lam -> bool array, shape batch: lam inside the natural domain
    moment_nodes: Callable  # mu -> (nodes, weights)
    matches: (
        Callable  # numpyro Distribution -> bool: a prior of this family (isinstance, event dims)
    )
    # (rng_key, shape, num_categories=None) -> lam: a fixed valid natural parameter for draws
    # of ``shape`` (the planner's structural probes)
    reference_natural: Callable
    # (lam, target, beta) -> lam: a step towards ``target`` that stays in the natural
    # domain whatever ``target`` is (None: the engine halves beta until valid instead)
    domain_preserving_step: Callable | None = None
    # Gaussian families: (mean, covariance or variance) -> (nodes, weights), the moment
    # nodes of a q given by its moments rather than its mean parameters (in float32,
    # E[x x^T] - m m^T loses a variance below about 1e-7 m^2; the engine reads the
    # moments from the natural parameters instead, ``gaussian_moments``)
    moment_nodes_at: Callable | None = None


# Fields a family module may leave out (the record's defaults apply).
OPTIONAL_FIELDS = ("domain_preserving_step", "moment_nodes_at")


def family_from_namespace(name: str, event_ndim: int, namespace: dict) -> Family:
    """The Family whose functions are the same-named ones in ``namespace``.

    Each family module defines ``sufficient_statistics``, ``natural_to_mean``, ...
    at top level and builds its record with ``family_from_namespace(..., globals())``.
    """
    fields = {f: namespace[f] for f in Family._fields[2:] if f not in OPTIONAL_FIELDS}
    fields.update({f: namespace[f] for f in OPTIONAL_FIELDS if f in namespace})
    return Family(name, event_ndim, **fields)


def unwrap_distribution(d: dist.Distribution) -> dist.Distribution:
    """Strip ``ExpandedDistribution``, ``Independent`` and ``MaskedDistribution`` wrappers.

    Returns the innermost distribution.  Its parameters broadcast against the
    wrapped distribution's ``batch_shape + event_shape`` (numpy rules, right
    aligned), which is how the families' ``from_numpyro`` read them.  A mask
    only affects ``log_prob``, so it is ignored here.
    """
    while isinstance(d, ExpandedDistribution | Independent | MaskedDistribution):
        d = d.base_dist
    return d


def symmetrize(a: jnp.ndarray) -> jnp.ndarray:
    """``(a + a^T) / 2`` over the last two axes. Shape ``(..., D, D)`` -> same."""
    return 0.5 * (a + jnp.swapaxes(a, -1, -2))


def cho_solve(chol: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """Solve ``(L L^T) x = b`` given the lower Cholesky factor ``L``.

    Args:
        chol: ``(..., D, D)`` lower triangular.
        b: ``(..., D)`` (vector right-hand side) or ``(..., D, K)``.

    Returns:
        ``x`` with the broadcast batch shape of ``chol`` and ``b``; trailing
        shape ``(D,)`` or ``(D, K)`` like ``b``.
    """
    vector = b.ndim == chol.ndim - 1
    if vector:
        b = b[..., None]
    batch = jnp.broadcast_shapes(chol.shape[:-2], b.shape[:-2])
    chol = jnp.broadcast_to(chol, batch + chol.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    y = solve_triangular(chol, b, lower=True)
    x = solve_triangular(chol, y, lower=True, trans="T")
    return x[..., 0] if vector else x


def trigamma(x: jnp.ndarray) -> jnp.ndarray:
    """``psi'(x)`` for ``x > 0``, elementwise; shape ``x.shape``.

    Recurrence ``psi'(x) = psi'(x + 6) + sum_{k<6} 1/(x + k)^2`` and the
    asymptotic series at ``y = x + 6`` (Abramowitz & Stegun 6.4.12):
    ``1/y + 1/(2y^2) + 1/(6y^3) - 1/(30y^5) + 1/(42y^7) - 1/(30y^9) + 5/(66y^11)``.
    Relative error below ~2e-12 in float64.  Cheaper to compile and to
    differentiate than ``jax.scipy.special.polygamma(1, x)``.
    """
    acc = 1.0 / (x * x)
    for k in range(1, 6):
        acc = acc + 1.0 / ((x + k) * (x + k))
    y = x + 6.0
    iy2 = 1.0 / (y * y)
    tail = 1.0 - iy2 * (1.0 / 5.0 - iy2 * (1.0 / 7.0 - iy2 * (1.0 / 5.0 - iy2 * (5.0 / 11.0))))
    return acc + 1.0 / y + 0.5 * iy2 + tail * iy2 / (6.0 * y)
