"""Exponential families as records of pure JAX functions (see ``docs/internals.md``).

Each family is a :class:`Family` instance; ``FAMILIES`` maps its name to it.
``family_for_distribution`` picks the family of a numpyro distribution and
``natural_from_prior`` reads its natural parameters.
"""

from __future__ import annotations

import jax.numpy as jnp
from numpyro import distributions as dist

from . import mvnormal
from .base import Family, unwrap_distribution
from .bernoulli import Bernoulli
from .beta import Beta
from .categorical import Categorical
from .dirichlet import Dirichlet
from .gamma import Gamma
from .inverse_gamma import InverseGamma
from .mvnormal import MultivariateNormal
from .normal import Normal

__all__ = [
    "Family",
    "Normal",
    "MultivariateNormal",
    "Gamma",
    "InverseGamma",
    "Beta",
    "Dirichlet",
    "Categorical",
    "Bernoulli",
    "FAMILIES",
    "family_for_distribution",
    "natural_from_prior",
    "unwrap_distribution",
    "gaussian_mean_variance",
    "gaussian_moments",
]

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Normal,
        MultivariateNormal,
        Gamma,
        InverseGamma,
        Beta,
        Dirichlet,
        Categorical,
        Bernoulli,
    )
}


def family_for_distribution(d: dist.Distribution) -> Family | None:
    """The family of a numpyro distribution, or ``None`` if none matches.

    ``ExpandedDistribution``, ``Independent`` and ``MaskedDistribution``
    wrappers are unwrapped first.  A ``Normal`` gives ``Normal`` (elementwise)
    when the wrapped distribution has no event dimensions and
    ``MultivariateNormal`` (over the last axis) when it has exactly one; with
    two or more event dimensions it gives ``None``.  ``Exponential`` gives
    ``Gamma``; ``InverseGamma`` gives ``InverseGamma``; ``CategoricalProbs``/``CategoricalLogits`` give ``Categorical``;
    ``BernoulliProbs``/``BernoulliLogits`` give ``Bernoulli``.  Subclasses
    match their parent (``Chi2`` -> Gamma, ``BetaProportion`` -> Beta,
    ``OrderedLogistic`` -> Categorical). Each family's module declares what it
    matches (``matches``), so a new family is one module plus its entry in
    ``FAMILIES``.
    """
    for family in FAMILIES.values():
        if family.matches(d):
            return family
    return None


def natural_from_prior(d: dist.Distribution) -> tuple:
    """Natural parameters ``lam`` of a numpyro distribution in its family's layout.

    Shapes follow the wrapped distribution: for elementwise families each
    array has shape ``d.batch_shape + d.event_shape``; for
    ``MultivariateNormal`` ``(batch + (D,), batch + (D, D))`` and for
    ``Dirichlet`` ``batch + (K,)`` with ``batch + (D,)`` / ``batch + (K,)`` equal to
    ``d.batch_shape + d.event_shape``; for ``Categorical``
    ``d.batch_shape + d.event_shape + (K,)``.  ``Exponential(rate)`` is read as
    ``Gamma(1, rate)`` and ``Normal(...).to_event(1)`` as a
    ``MultivariateNormal`` with diagonal precision.

    Raises:
        TypeError: if ``family_for_distribution(d)`` is ``None``.
    """
    family = family_for_distribution(d)
    if family is None:
        raise TypeError(
            f"natural_from_prior: no exponential family for {type(unwrap_distribution(d)).__name__} "
            f"with event_shape {tuple(d.event_shape)}; supported: {', '.join(FAMILIES)}"
        )
    return family.from_numpyro(d)


def gaussian_moments(lam, q_family: str, xp=jnp):
    """``(mean, covariance)`` of a MultivariateNormal q (``(mean, variance)`` per
    coordinate of a Normal q), read from its natural parameters ``lam`` (``xp``:
    ``jax.numpy`` or ``numpy``).

    Not ``E[x x^T] - m m^T``: in float32 that difference cancels once the variance is
    below about ``1e-7 mean^2`` (a Poisson GLM's intercept at 6 +- 0.001 from 2,000
    counts near 400 came out with variance 0 or negative)."""
    eta1, eta2 = lam
    if q_family == "MultivariateNormal":
        # (mvnormal.precision_to_moments: not inv(P) @ P m, whose float32 rounding times
        # P m put a Poisson GLM's predictor means 19 sd off)
        return mvnormal.precision_to_moments(eta1, -(eta2 + xp.swapaxes(eta2, -1, -2)), xp)
    var = -0.5 / eta2
    return eta1 * var, var


def gaussian_mean_variance(lam, q_family: str, xp=jnp):
    """``(mean, variance)`` per coordinate of a Normal or MultivariateNormal q: the
    diagonal of :func:`gaussian_moments`."""
    mean, cov = gaussian_moments(lam, q_family, xp)
    if q_family == "MultivariateNormal":
        return mean, xp.diagonal(cov, axis1=-2, axis2=-1)
    return mean, cov
