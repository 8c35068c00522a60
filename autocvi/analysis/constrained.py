"""q of a constrained site: a Gaussian pushed through the support's bijection.

A latent whose support is not the real line (a ``HalfCauchy`` scale, a ``Uniform``
or ``Beta`` probability) gets a Gaussian q on its unconstrained coordinates, so its
q over the site's value is ``TransformedDistribution(Gaussian, biject_to(support))``.
NumPyro's ``TransformedDistribution`` has no ``mean`` or ``variance`` (it raises an
empty ``NotImplementedError``), and ``result.posterior["sigma"].mean`` is the first
thing a user asks. :class:`Constrained` is that distribution with both: every
element of the value is a monotone function ``g`` of one Gaussian coordinate
``m + s z``, so

    E[g(m + s z)] = sum_k w_k g(m + s x_k),   Var = sum_k w_k (g(m + s x_k) - E)^2,

by 64-node Gauss-Hermite quadrature (nodes ``x_k``, weights ``w_k`` of the standard
normal). For ``exp`` this is the log-normal's ``exp(m + s^2 / 2)`` to about 1e-12
relative for ``s <= 3`` (the tests check it against the closed form). A transform that
mixes elements (stick-breaking, ordered, correlation Cholesky) has no such formula: its
``mean`` raises a ``NotImplementedError`` that says what to use instead.

:func:`normal_chain` and :func:`transform_sign` are shared with the guide's
marginal quantiles (:mod:`autocvi.infer.guide`).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from numpyro import distributions as dist
from numpyro.distributions import transforms as T

__all__ = ["Constrained", "normal_chain", "transform_sign", "chain_moments", "GH_MOMENT_ORDER"]

GH_MOMENT_ORDER = 64
_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(GH_MOMENT_ORDER)
_WEIGHTS = _WEIGHTS / np.sqrt(2.0 * np.pi)


class Constrained(dist.TransformedDistribution):
    """``TransformedDistribution(base, transforms)`` with elementwise ``mean`` and
    ``variance`` (module docstring) when ``base`` is Gaussian and every transform is
    elementwise monotone; the constructor is NumPyro's."""

    def _moments(self):
        chain = normal_chain(self)
        if chain is None:
            names = ", ".join(type(t).__name__ for t in _flatten(self.transforms))
            raise NotImplementedError(
                f"this q is a Gaussian pushed through {names}, which mixes elements, so its "
                "mean and variance have no closed form; estimate them from draws "
                "(FitResult.sample or q.sample), or use autocvi.print_summary or "
                "CVIGuide.quantiles / median"
            )
        return chain_moments(*chain)

    @property
    def mean(self):
        return self._moments()[0]

    @property
    def variance(self):
        return self._moments()[1]


def chain_moments(loc, scale, transforms):
    """Elementwise mean and variance of ``transforms(loc + scale * z)``, z ~ N(0, 1),
    by Gauss-Hermite quadrature (exact when no transform is nonlinear)."""
    z = jnp.reshape(jnp.asarray(_NODES, loc.dtype), (-1,) + (1,) * jnp.ndim(loc))
    x = loc + scale * z
    for t in transforms:
        x = t(x)
    w = jnp.reshape(jnp.asarray(_WEIGHTS, x.dtype), (-1,) + (1,) * (x.ndim - 1))
    mean = jnp.sum(w * x, axis=0)
    return mean, jnp.maximum(jnp.sum(w * (x - mean) ** 2, axis=0), 0.0)


def normal_chain(q):
    """``(loc, scale, transforms)`` with each element of q distributed as
    ``transforms(loc + scale * z)``, z standard normal, every transform elementwise
    monotone (or a reshape); None when q is not of that form. A distribution with
    Gaussian marginals that is not a NumPyro Gaussian (a Gaussian block's structured
    posterior) says so with ``gaussian_marginals = True``."""
    if isinstance(q, (dist.Independent, dist.MaskedDistribution)):
        return normal_chain(q.base_dist)
    if isinstance(q, dist.ExpandedDistribution):
        inner = normal_chain(q.base_dist)
        if inner is None or inner[2]:
            return None
        shape = tuple(q.batch_shape) + tuple(q.event_shape)
        return jnp.broadcast_to(inner[0], shape), jnp.broadcast_to(inner[1], shape), []
    if isinstance(q, dist.Normal):
        shape = tuple(q.batch_shape)
        return jnp.broadcast_to(q.loc, shape), jnp.broadcast_to(q.scale, shape), []
    if isinstance(q, dist.MultivariateNormal) or getattr(q, "gaussian_marginals", False):
        return q.mean, jnp.sqrt(q.variance), []
    if isinstance(q, dist.TransformedDistribution):
        inner = normal_chain(q.base_dist)
        if inner is None:
            return None
        transforms = _flatten(q.transforms)
        if any(transform_sign(t) is None for t in transforms):
            return None
        return inner[0], inner[1], list(inner[2]) + transforms
    return None


def _flatten(transforms):
    out = []
    for t in transforms:
        if isinstance(t, T.ComposeTransform):
            out.extend(_flatten(t.parts))
        else:
            out.append(t)
    return out


def transform_sign(t):
    """+1 / -1 (elementwise array) for an increasing / decreasing elementwise
    transform or a reshape; None for anything else."""
    if isinstance(
        t,
        (
            T.IdentityTransform,
            T.ExpTransform,
            T.SigmoidTransform,
            T.SoftplusTransform,
            T.ReshapeTransform,
        ),
    ):
        return 1.0
    if isinstance(t, T.AffineTransform):
        sign = jnp.sign(t.scale)
        return None if bool(jnp.any(sign == 0)) else sign
    if isinstance(t, T.PowerTransform):
        sign = jnp.sign(t.exponent)
        return None if bool(jnp.any(sign == 0)) else sign
    if isinstance(t, T.IndependentTransform):
        return transform_sign(t.base_transform)
    if isinstance(t, T.ComposeTransform):
        signs = [transform_sign(p) for p in t.parts]
        if any(s is None for s in signs):
            return None
        out = 1.0
        for s in signs:
            out = out * s
        return out
    if type(t).__name__ == "_InverseTransform":
        return transform_sign(t.inv)
    return None
