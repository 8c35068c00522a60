"""Expected log factors ``E_q[log p_a]`` over a factor's latent neighbours.

Each neighbour j of factor a is represented by a small weighted point set in
its site layout:

* *moment nodes* (``Family.moment_nodes``) when the factor is conjugate in j:
  the factor is affine in phi_j(z_j), so the nodes give the exact expectation
  (DESIGN.md section 5: tensor product of moment-matched nodes);
* *samples* from q_j otherwise (Monte Carlo, weight 1/S).

The expectation is the weighted sum of the factor's per-element log density
over the tensor product of the neighbours' point sets. Weights are aligned to
the factor's plate axes, so a local latent in plate N weights factor element n
by its own q_n (closed-form discrete messages need no enumeration over the
whole plate: CVI paper Alg. 2 with VMP messages).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from .layout import LatentLayout

__all__ = [
    "Alignment",
    "PointSet",
    "moment_point_set",
    "moments_point_set",
    "sample_point_set",
    "expect",
    "alignment",
    "spherical_radial",
]


@dataclass(frozen=True)
class Alignment:
    """How a latent's element axes map onto a factor's batch axes.

    ``axes[k]`` is the factor batch axis of the latent's k-th weight axis, or
    ``None`` when the factor is not inside that plate (then the weights must be
    equal along it and are reduced).
    """

    axes: tuple[int | None, ...]
    factor_ndim: int

    @property
    def exact_for_discrete(self) -> bool:
        return all(a is not None for a in self.axes)


@dataclass
class PointSet:
    """Points ``(P,) + site_shape`` and weights ``(P,) + factor-aligned shape``."""

    points: jax.Array
    weights: jax.Array


def alignment(
    layout: LatentLayout, var_plates, var_batch_ndim, factor_plates, factor_ndim
) -> Alignment:
    """Map the weight axes of ``layout`` onto the batch axes of a factor.

    The latent's weight axes are its leading element axes; those that belong
    to a plate the factor is also inside map to the factor's axis for that
    plate (numpyro gives a plate the same ``dim`` everywhere).
    """
    factor_dims = {p.name: p.dim for p in factor_plates}
    by_axis = {var_batch_ndim + p.dim: p for p in var_plates}
    axes = []
    for k in range(layout.weight_ndim):
        plate = by_axis.get(k)
        if plate is not None and plate.name in factor_dims:
            axes.append(factor_ndim + factor_dims[plate.name])
        else:
            axes.append(None)
    return Alignment(tuple(axes), factor_ndim)


def _align_weights(weights, align: Alignment, uniform: bool):
    """``(P,) + element shape`` -> ``(P,) + shape broadcastable to the factor's batch``."""
    w = weights
    # Reduce axes the factor does not share (weights are equal along them).
    for k in reversed(range(len(align.axes))):
        if align.axes[k] is None:
            if not uniform:
                raise ValueError("unaligned discrete weights")
            w = jnp.take(w, 0, axis=k + 1)
    kept = [a for a in align.axes if a is not None]
    perm = sorted(range(len(kept)), key=lambda i: kept[i])
    w = jnp.transpose(w, [0] + [1 + i for i in perm])
    out_shape = [w.shape[0]] + [1] * align.factor_ndim
    for j, i in enumerate(perm):
        out_shape[1 + kept[i]] = w.shape[1 + j]
    return jnp.reshape(w, out_shape)


def moment_point_set(layout: LatentLayout, mu, align: Alignment) -> PointSet:
    """Moment nodes of q (exact for factors affine in phi); differentiable in ``mu``."""
    nodes, weights = layout.fam.moment_nodes(mu)
    weights = jnp.broadcast_to(weights, nodes.shape[:1] + _element_shape(layout))
    return PointSet(layout.to_site(nodes), _align_weights(weights, align, layout.uniform_weights))


def moments_point_set(layout: LatentLayout, moments, align: Alignment) -> PointSet:
    """Moment nodes of a Gaussian q given by its ``(mean, covariance)`` (``(mean,
    variance)`` for a Normal q); differentiable in both. The engine's exact messages
    and ELBO use these, read from q's natural parameters: from the mean parameters,
    ``E[x x^T] - m m^T`` cancels in float32 once a variance is below about ``1e-7 m^2``
    (the group means of a hierarchy of measurements near 1,500, with sds near 0.3,
    lost their variances, and every update was refused)."""
    nodes, weights = layout.fam.moment_nodes_at(*moments)
    weights = jnp.broadcast_to(weights, nodes.shape[:1] + _element_shape(layout))
    return PointSet(layout.to_site(nodes), _align_weights(weights, align, layout.uniform_weights))


def sample_point_set(
    layout: LatentLayout, lam, rng_key, num_samples: int, align: Alignment
) -> PointSet:
    """``num_samples`` draws of q (reparameterised where the family allows)."""
    draws = layout.fam.sample(rng_key, lam, (num_samples,))
    weights = jnp.full((num_samples,) + (1,) * align.factor_ndim, 1.0 / num_samples, draws.dtype)
    return PointSet(layout.to_site(draws), weights)


def point_mass(layout: LatentLayout, x, align: Alignment) -> PointSet:
    """A single point ``x`` (family layout) with weight one."""
    return PointSet(layout.to_site(x)[None], jnp.ones((1,) + (1,) * align.factor_ndim, x.dtype))


def _element_shape(layout: LatentLayout) -> tuple[int, ...]:
    return layout.family_shape[: layout.weight_ndim]


def expect(log_density: Callable, point_sets: dict[str, PointSet], fixed: dict) -> jax.Array:
    """``sum over elements of E[log p_a]`` over the tensor product of point sets.

    Args:
        log_density: ``f(values) -> array`` of shape ``factor batch``.
        point_sets: neighbour name -> PointSet.
        fixed: other values the factor needs (params, plate indices).

    Returns:
        a scalar.
    """
    names = list(point_sets)

    def f(*pts):
        return log_density({**fixed, **dict(zip(names, pts))})

    g = f
    for k in reversed(range(len(names))):
        g = jax.vmap(g, in_axes=tuple(0 if i == k else None for i in range(len(names))))
    values = g(*(point_sets[n].points for n in names))  # (P1, ..., Pk) + factor batch
    for k in reversed(range(len(names))):
        w = point_sets[names[k]].weights
        values = jnp.sum(values * w, axis=k)
    return jnp.sum(values)


# Probabilists' Gauss-Hermite rule, E_{N(0,1)}[g] ~= sum_q w_q g(x_q), shared by
# the engine's per-edge messages and the Gaussian blocks' site messages.
GH_ORDER = 32
GH_NODES, GH_WEIGHTS = (np.asarray(a) for a in np.polynomial.hermite_e.hermegauss(GH_ORDER))
GH_WEIGHTS = GH_WEIGHTS / np.sqrt(2.0 * np.pi)


def spherical_radial(rest: Callable, mean, cov):
    """``(E, g, H)``: ``E[l(eta_n)]``, ``E[grad l]``, ``E[hess l]`` per row ``n`` under
    ``eta_n ~ N(mean_n, cov_n)``, by the third-degree spherical-radial cubature rule.

    ``rest(eta) -> (N,)`` with ``eta`` of shape ``(N, K)`` and element ``n`` reading row
    ``n`` only (a vector linear predictor's rest); ``mean``: ``(N, K)``; ``cov``:
    ``(N, K, K)``. The rule: ``2K`` points ``mean_n +- sqrt(K) L_n e_j`` with ``L_n
    L_n^T = cov_n`` and equal weights ``1/(2K)`` (Arasaratnam & Haykin, "Cubature
    Kalman Filters", IEEE Trans. Automatic Control 54(6), 2009, Sec. IV; the unscented
    transform with kappa = 0, Julier & Uhlmann 1997). It integrates every polynomial
    of total degree <= 3 exactly, so ``E`` is exact for cubic ``l``, ``g`` for quartic
    and ``H`` for quintic ``l``. ``L_n`` is a symmetric eigen-square-root with negative
    eigenvalues (rounding of a singular ``cov``) clipped at zero: any square root gives
    the same degree.

    ``g`` and ``H`` are the rule applied to the gradient and Hessian (Bonnet's and
    Price's theorems: ``dE/dmean = E[grad l]``, ``dE/dcov = E[hess l]/2``), the targets
    of a Gaussian's natural parameters in CVI (Khan & Lin 2017, App. B.1) blockwise per
    row; they are not the derivatives of the rule's ``E``, which would carry the rule's
    error in ``L``'s derivative. The Hessian blocks are ``K`` Jacobian-vector products
    of the gradient with one basis vector broadcast over the rows (the rows are
    independent, so one product gives column ``k`` of every row's block).
    """
    n, k = mean.shape
    s, q = jnp.linalg.eigh(0.5 * (cov + jnp.swapaxes(cov, -1, -2)))
    root = q * jnp.sqrt(jnp.maximum(s, 0.0))[..., None, :]  # (N, K, K), root root^T = cov
    unit = jnp.concatenate([jnp.eye(k), -jnp.eye(k)]).astype(mean.dtype) * np.sqrt(k)
    points = mean[None] + jnp.einsum("nij,pj->pni", root, unit)  # (2K, N, K)

    def total(eta):
        return jnp.sum(rest(eta))

    grad = jax.grad(total)
    eye = jnp.eye(k, dtype=mean.dtype)

    def at(eta):
        value = rest(eta)
        g = grad(eta)
        cols = jax.vmap(lambda e: jax.jvp(grad, (eta,), (jnp.broadcast_to(e, eta.shape),))[1])(eye)
        return value, g, jnp.moveaxis(cols, 0, -1)  # (N,), (N, K), (N, K, K)

    values, gs, hs = jax.vmap(at)(points)
    return jnp.mean(values, 0), jnp.mean(gs, 0), jnp.mean(hs, 0)
