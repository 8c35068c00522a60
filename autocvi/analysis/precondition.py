"""Affine coordinates for a joint Gaussian group whose curvature the working precision cannot hold.

A regression on an uncentred predictor in the thousands (a year) correlates its
intercept and slope at -0.9999x: q's precision over the group's coordinates ``z``
then has a condition number near 1e11, and in float32 (what users get by
default) the precision cannot be factorised at all. The posterior is not hard;
its coordinates are badly chosen. So the group gets new coordinates ``zeta``
with ``z = c + P zeta``, where ``c`` is the group's start and ``P`` whitens the
curvature there: ``P^T H P ~ I`` for ``H``, the negative Hessian of the log joint
at the start (a Laplace approximation's precision). q is a Gaussian over
``zeta``; the CVI natural-gradient step is invariant to an affine change of
coordinates in exact arithmetic (Khan & Lin 2017, "Conjugate-Computation
Variational Inference", Sec. 5: a Gaussian on the unconstrained space), so this
changes the floating-point conditioning only, not the fixed point.

``H`` is computed in the working precision and decomposed in float64: it is
first scaled to unit diagonal (Jacobi), which removes differences of scale
exactly, and what remains (the correlation) is well inside float32's range for
any model whose posterior correlations are not within 1e-7 of one. Its
eigenvalues are taken in absolute value and floored, so a start where the log
joint is not concave (or a direction the data do not inform) still gives an
invertible map.

Only groups that need it get new coordinates (the test is
:func:`needs_preconditioning`: condition number times the dtype's epsilon above
:data:`CONDITION_TOLERANCE`), so well-posed models run exactly as before.

A well-conditioned curvature is not enough in float32: q's natural parameter is
``P m``, and where the data pin a sum of coordinates tightly and the mean is far
from 0 its rounding moves the mean across that sum by a sizeable part of a
posterior sd (:func:`mean_resolution`). Such a group is centred on the mode and
whitened too, which makes ``m`` and ``P`` of order one.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ..jaxpr import structural_jit

__all__ = [
    "Affine",
    "CONDITION_TOLERANCE",
    "MAX_PRECONDITIONED_DIM",
    "local_quadratic",
    "newton_centre",
    "newton_mode",
    "RESOLUTION_NEWTON_HALVINGS",
    "RESOLUTION_NEWTON_STEPS",
    "RESOLUTION_TOLERANCE",
    "mean_resolution",
    "needs_preconditioning",
    "resolution_checked",
    "whitening_affine",
]

# Precondition when cond(H) * eps(dtype) exceeds this: float32 from cond ~8e4
# (its Cholesky fails near 1e7, and Monte Carlo Hessians lose digits well before),
# float64 from ~4.5e13.
CONDITION_TOLERANCE = 1e-2
# Groups larger than this are not preconditioned (their curvature is a dense D x D
# Hessian of the log joint); Gaussian blocks of that size have their own solvers.
MAX_PRECONDITIONED_DIM = 200
# Eigenvalues of the unit-diagonal curvature (of order one) are raised to this (a
# direction not concave at the start).
_EIGEN_FLOOR = 1e-10
# Newton steps that move the centre of new coordinates to the log joint's mode, and
# the predicted rise (nats) below which they stop.
NEWTON_STEPS = 10
_NEWTON_TOLERANCE = 1e-3
# Curvature below this fraction of the largest counts as none (a flat direction).
_FLAT = 1e-13
# Centre and whiten a group whose mean the working precision holds only to this many
# posterior sd at the mode (mean_resolution); checked where eps is above
# _RESOLUTION_EPS (float32: the Newton steps to the mode cost a few evaluations of a
# program already compiled; float64's eps would need a mean ~1e12 sd from 0).
RESOLUTION_TOLERANCE = 0.02
_RESOLUTION_EPS = 1e-10
# The Newton steps of that check: a Poisson GLM's start far below its counts (log rate 0
# against 7) needs a dozen halvings of its first steps and ~20 steps to the mode.
RESOLUTION_NEWTON_STEPS = 50
RESOLUTION_NEWTON_HALVINGS = 30


@dataclass(frozen=True, eq=False)
class Affine:
    """``z = shift + matrix @ zeta`` (and back), with the log-determinant of ``matrix``."""

    shift: np.ndarray
    matrix: np.ndarray
    inverse: np.ndarray
    log_abs_det: float
    condition: float  # of the curvature the map was built from (reported by plan())
    # whether the map is there because that curvature was too ill-conditioned for the
    # working precision (else: a minibatched fit's start, or the mean's resolution below;
    # analysis.joint.precondition_groups)
    ill_conditioned: bool = True
    # in posterior sd, how far the working precision's rounding of q's natural parameter
    # P m would move q's mean at the mode, when that is why the map is there (else None)
    resolution: float | None = None

    def forward(self, zeta):
        """``z`` from ``zeta`` (``(..., D)``)."""
        zeta = jnp.asarray(zeta)
        m = jnp.asarray(self.matrix, zeta.dtype)
        return jnp.asarray(self.shift, zeta.dtype) + jnp.einsum("ij,...j->...i", m, zeta)

    def backward(self, z):
        """``zeta`` from ``z``."""
        z = jnp.asarray(z)
        inv = jnp.asarray(self.inverse, z.dtype)
        return jnp.einsum("ij,...j->...i", inv, z - jnp.asarray(self.shift, z.dtype))


def local_quadratic(log_joint):
    """One compiled program ``z -> (log_joint(z), gradient, -Hessian)`` (at the working
    precision; :func:`newton_centre` reads it in float64)."""

    def quadratic(z):
        value, grad = jax.value_and_grad(log_joint)(z)
        return value, grad, -jax.hessian(log_joint)(z)

    return structural_jit(quadratic, runs_once=True)


def newton_centre(quadratic, z0, steps: int = NEWTON_STEPS, halvings: int = 4):
    """``(z, -Hessian at z)``: :func:`newton_mode` without whether it settled."""
    z, h, _ = newton_mode(quadratic, z0, steps, halvings)
    return z, h


def newton_mode(quadratic, z0, steps: int = NEWTON_STEPS, halvings: int = 4):
    """``(z, -Hessian at z, settled)``: up to ``steps`` Newton steps from ``z0`` on the
    log joint, each with the absolute eigenvalues of the curvature (so a non-concave
    start still climbs) and halved up to ``halvings`` times until the log joint rises;
    the last point that rose is kept. ``settled``: the steps stopped before ``steps``
    because the predicted rise was below a thousandth of a nat or no halving rose (in
    float32 near a mode of large counts, the log joint's rounding); not where it rose
    at every step (a hierarchy's funnel, whose log joint grows without bound as its
    scale shrinks) or stopped at a value that is not finite.

    Why the centre moves: q's coordinates are ``zeta`` with ``z = centre + P zeta``, and
    the engine works with q's second moment ``m m^T + S``: when ``|m|`` is thousands
    of posterior sd (a start far from the data, whitened), ``S`` is lost to rounding in
    float32. From the Laplace point, ``m`` stays within a few sd of 0.
    """
    dtype = jnp.result_type(z0)

    def at(z):
        v, g, h = quadratic(jnp.asarray(z, dtype))
        return float(v), np.asarray(g, np.float64), np.asarray(h, np.float64)

    z = np.asarray(z0, np.float64)
    value, grad, h = at(z)
    for _ in range(steps):
        if not (np.isfinite(value) and np.all(np.isfinite(grad)) and np.all(np.isfinite(h))):
            return z, h, False
        p = whitening_affine(h, z, 1.0).matrix
        step = p @ (p.T @ grad)
        if 0.5 * float(grad @ step) < _NEWTON_TOLERANCE:
            return z, h, True
        for _ in range(halvings + 1):
            candidate = at(z + step)
            # a candidate whose curvature is not finite (a Gamma precision's Hessian
            # overflowing float32 far out on its log scale) cannot be whitened: not taken
            finite = all(np.all(np.isfinite(c)) for c in candidate)
            if finite and candidate[0] > value:
                break
            step = 0.5 * step
        else:
            return z, h, True
        z = z + step
        value, grad, h = candidate
    return z, h, False


def resolution_checked(dtype) -> bool:
    """Whether :func:`mean_resolution` is worth checking at ``dtype``'s precision."""
    return float(jnp.finfo(dtype).eps) > _RESOLUTION_EPS


def needs_preconditioning(neg_hessian: np.ndarray, dtype) -> tuple[bool, float]:
    """``(needed, condition number)`` of the curvature at ``dtype``'s precision.

    Directions the log joint does not read at the start (zero curvature, such as
    the observed entries of NumPyro's ``y_unobserved``) are left out: they are
    flat, not ill-conditioned, and new coordinates would not help them.
    """
    h = 0.5 * (neg_hessian + neg_hessian.T)
    if not np.all(np.isfinite(h)):
        return False, float("nan")
    ev = np.abs(np.linalg.eigvalsh(h))
    informed = ev[ev > ev.max() * _FLAT]
    if informed.size < 2:
        return False, float("nan")
    condition = float(informed.max() / informed.min())
    return condition * float(jnp.finfo(dtype).eps) > CONDITION_TOLERANCE, condition


def mean_resolution(neg_hessian: np.ndarray, centre: np.ndarray, dtype) -> float:
    """In posterior sd (the largest over the coordinates), how far rounding q's natural
    parameter ``eta1 = P m`` to ``dtype`` moves q's mean, at the Laplace point (``P`` the
    curvature, ``m`` the mode ``centre``): ``|P^-1 delta|`` with ``delta_i = eps |eta1_i|``.
    NaN where the curvature is not positive definite there.

    Large where the data pin a sum of coordinates far more tightly than its parts and the
    mean is far from 0: a Poisson GLM's intercept and group effects at 3,000 counts near
    1,100 have ``P`` ~ 3e5 along each ``b0 + u_g``, ~10 across, and ``eta1`` ~ 2.4e7, so
    float32 holds the mean across to ~0.28 sd; with q's moments read exactly but in the
    start's coordinates, the float32 fit ended 0.4-1.1 sd from NUTS on b0 and the u,
    converged and unwarned (float64: 0.01). Its condition number (~3e4) is
    below :data:`CONDITION_TOLERANCE`'s: it is the mean's magnitude that is too large.
    """
    h = 0.5 * (neg_hessian + neg_hessian.T)
    if not (np.all(np.isfinite(h)) and np.all(np.isfinite(centre))):
        return float("nan")
    ev, vec = np.linalg.eigh(h)
    if ev.min() <= ev.max() * _FLAT:
        return float("nan")
    cov = (vec / ev) @ vec.T
    rounding = float(jnp.finfo(dtype).eps) * np.abs(h @ centre)
    moved = np.sqrt((cov**2) @ rounding**2)
    return float(np.max(moved / np.sqrt(np.diag(cov))))


def whitening_affine(
    neg_hessian: np.ndarray,
    shift,
    condition: float,
    ill_conditioned: bool = True,
    resolution: float | None = None,
) -> Affine:
    """The map ``z = shift + P zeta`` with ``P^T H P ~ I`` (module docstring).

    A coordinate with zero curvature keeps unit scale and stays out of the rotation.
    """
    h = 0.5 * (neg_hessian + neg_hessian.T)
    diag = np.abs(np.diag(h))
    flat = diag <= diag.max() * _FLAT
    d = np.where(flat, 1.0, 1.0 / np.sqrt(np.where(flat, 1.0, diag)))
    scaled = h * d[:, None] * d[None, :]
    scaled[flat, :] = scaled[:, flat] = 0.0
    scaled[flat, flat] = 1.0
    ev, vec = np.linalg.eigh(scaled)
    ev = np.maximum(np.abs(ev), _EIGEN_FLOOR)
    matrix = d[:, None] * vec / np.sqrt(ev)[None, :]
    inverse = (vec * np.sqrt(ev)[None, :]).T / d[None, :]
    log_abs_det = float(np.sum(np.log(d)) - 0.5 * np.sum(np.log(ev)))
    return Affine(
        np.asarray(shift, np.float64),
        matrix,
        inverse,
        log_abs_det,
        condition,
        ill_conditioned,
        resolution,
    )
