"""How a Gaussian block turns its sites into a posterior: one protocol, three solvers.

A :class:`~autocvi.blocks.gaussian_block.GaussianBlock` holds a Gaussian
prior over ``x`` (``block.prior``) and one Gaussian pseudo-observation
("site") per predictor element ``eta = A x + b`` (``lam1``, ``lam2``). A
solver exploits the structure of that product (the CVI paper's exact
linear-algebra step for GLM blocks, Khan & Lin 2017, App. E; the KL-proximal
paper's function-space form, Khan et al. 2015, Eq. 19):

* ``weight-space``: a D x D Cholesky (N sites >= D, or a dense prior);
* ``function-space``: an N x N Cholesky through the predictors' prior
  covariance (N < D, or a GP whose prior is a kernel);
* ``markov``: a tridiagonal precision (a Gaussian random walk), O(T).

Each implements :class:`BlockSolver`: the solve, the posterior's moments, draws,
exact log density, log determinant and the variances of linear maps of ``x``
(what :class:`~autocvi.blocks.gaussian_block.BlockPosterior` exposes); :data:`BLOCK_SOLVERS` maps the name a
block records to it. Adding a solver is one class here plus one entry.
"""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp

from . import solvers as gs

__all__ = ["BlockSolver", "BLOCK_SOLVERS", "WeightSpace", "FunctionSpace", "Markov"]


class BlockSolver(Protocol):
    """What a block asks of its solver (``block`` gives the prior and the terms)."""

    name: str
    # Whether sites of negative precision (lam2 > 0) are solved as they are (else the
    # block clips them at zero).
    signed_sites: bool

    def solve(self, block, lam1, lam2):
        """``(SiteMarginals, aux)``: the predictors' posterior marginals and the factors."""

    def moments(self, block, aux):
        """Posterior mean and marginal variance of ``x`` (the family layout)."""

    def precision(self, block, W):
        """Dense posterior precision of ``x`` for site precisions ``W`` (small blocks)."""

    def sample(self, block, aux, key, num_samples):
        """``(num_samples, D)`` draws of ``x`` without forming a D x D covariance."""

    def predictive_variance(self, block, aux, a):
        """``diag(a Cov_q[x] a^T)`` for rows ``a`` (``(M, D)``), no D x D covariance."""

    def log_det_covariance(self, block, aux):
        """``log det Cov_q[x]``."""

    def log_density(self, block, aux, x):
        """The exact ``log q(x)`` for ``x`` of shape ``(..., D)``, no D x D covariance."""


def _gaussian_log_density(quad, half_log_det_precision, dim):
    """``log N`` from the Mahalanobis term and half the log determinant of the precision."""
    return -0.5 * quad + half_log_det_precision - 0.5 * dim * jnp.log(2.0 * jnp.pi)


def _half_log_det(C):
    """Half the log determinant of ``C C^T`` for a triangular ``C``."""
    return jnp.sum(jnp.log(jnp.diagonal(C)))


def _dense_precision(block, W):
    A = jnp.concatenate([t.A for t in block.terms])
    prior_precision = block.prior.get("Q0")
    if prior_precision is None:
        prior_precision = jnp.diag(1.0 / block.prior["sd0"] ** 2)
    return prior_precision + A.T @ (W[:, None] * A)


class WeightSpace:
    name = "weight-space"
    # Sites of negative precision are fine while the posterior's stays positive definite.
    signed_sites = True

    def solve(self, block, lam1, lam2):
        return gs.weight_space(block.prior["At"], block.prior["mf"], lam1, lam2)

    def moments(self, block, aux):
        mean_u, C = aux
        inv_c = jax.scipy.linalg.solve_triangular(C, jnp.eye(C.shape[0], dtype=C.dtype), lower=True)
        m0 = block.prior["m0"]
        if "L0" in block.prior:  # Cov_x = L0 C^-T C^-1 L0^T
            rows = block.prior["L0"] @ inv_c.T
            return m0 + block.whitened_to_x(mean_u), jnp.sum(rows * rows, axis=1)
        sd0 = block.prior["sd0"]
        return m0 + sd0 * mean_u, sd0 * sd0 * jnp.sum(inv_c * inv_c, axis=0)

    precision = staticmethod(_dense_precision)

    def sample(self, block, aux, key, num_samples):
        mean_u, C = aux
        e = jax.random.normal(key, (num_samples, C.shape[0]), C.dtype)
        u = mean_u[None] + jax.scipy.linalg.solve_triangular(C.T, e.T, lower=False).T
        return block.prior["m0"][None] + block.whitened_to_x(u)

    # Cov_u = B^-1 = C^-T C^-1 with B = C C^T the posterior precision of u.
    def predictive_variance(self, block, aux, a):
        _, C = aux
        V = jax.scipy.linalg.solve_triangular(C, block.rows_times_prior_factor(a).T, lower=True)
        return jnp.sum(V * V, axis=0)

    def log_det_covariance(self, block, aux):
        return 2.0 * (block.log_det_prior_factor - _half_log_det(aux[1]))

    def log_density(self, block, aux, x):
        mean_u, C = aux
        r = block.x_to_whitened(x) - mean_u
        quad = jnp.sum((r @ C) ** 2, axis=-1)  # |C^T r|^2 = r^T B r
        return _gaussian_log_density(quad, _half_log_det(C), block.dim) - block.log_det_prior_factor


class FunctionSpace:
    name = "function-space"
    # The Woodbury form takes the square roots of the site precisions.
    signed_sites = False

    def solve(self, block, lam1, lam2):
        p = block.prior
        return gs.function_space(p["At"], p["mf"], lam1, lam2, p.get("K"))

    def moments(self, block, aux):
        alpha, s, C = aux
        At, sd0 = block.prior["At"], block.prior["sd0"]
        mean_u = At.T @ alpha
        var_u = gs.function_space_weights(At, s, C)
        return block.prior["m0"] + sd0 * mean_u, sd0 * sd0 * var_u

    precision = staticmethod(_dense_precision)

    def sample(self, block, aux, key, num_samples):
        alpha, s, C = aux
        u = gs.function_space_sample(key, block.prior["At"], alpha, s, C, num_samples)
        return block.prior["m0"][None] + block.whitened_to_x(u)

    # Cov_u = I - At^T s Bf^-1 s At; the precision of u is B = I + (s At)^T (s At) and
    # det B = det Bf = det(C C^T) (Sylvester).
    def predictive_variance(self, block, aux, a):
        _, s, C = aux
        b = block.rows_times_prior_factor(a)  # (M, D)
        V = jax.scipy.linalg.solve_triangular(
            C, s[:, None] * (block.prior["At"] @ b.T), lower=True
        )  # (N, M)
        return jnp.sum(b * b, axis=1) - jnp.sum(V * V, axis=0)

    def log_det_covariance(self, block, aux):
        return 2.0 * (block.log_det_prior_factor - _half_log_det(aux[2]))

    def log_density(self, block, aux, x):
        alpha, s, C = aux
        At = block.prior["At"]
        r = block.x_to_whitened(x) - At.T @ alpha
        p = (r @ At.T) * s  # s At r, (..., N)
        quad = jnp.sum(r * r, axis=-1) + jnp.sum(p * p, axis=-1)
        return _gaussian_log_density(quad, _half_log_det(C), block.dim) - block.log_det_prior_factor


class Markov:
    name = "markov"
    signed_sites = True

    def solve(self, block, lam1, lam2):
        (term,) = block.terms
        p = block.prior
        return gs.markov(p["q_diag"], p["q_off"], p["h"], term.a, term.b, lam1, lam2, p["factored"])

    def moments(self, block, aux):
        return gs.markov_posterior(*aux)

    def precision(self, block, W):
        p = block.prior
        (term,) = block.terms
        q = jnp.diag(p["q_diag"]) + jnp.diag(p["q_off"][1:], -1) + jnp.diag(p["q_off"][1:], 1)
        return q + jnp.diag(term.a * term.a * W)

    def sample(self, block, aux, key, num_samples):
        return gs.markov_sample(key, aux[0], aux[1], num_samples)

    # The posterior precision is L L^T with L lower bidiagonal (diagonal d, subdiagonal e).
    def predictive_variance(self, block, aux, a):
        (d, e), _ = aux
        y = jax.vmap(lambda row: gs.bidiagonal_solve_lower(d, e, row))(a)  # L^-1 a^T
        return jnp.sum(y * y, axis=1)

    def log_det_covariance(self, block, aux):
        (d, _), _ = aux
        return -2.0 * jnp.sum(jnp.log(d))

    def log_density(self, block, aux, x):
        (d, e), mean_x = aux
        r = x - mean_x
        # (L^T r)_t = d_t r_t + e_{t+1} r_{t+1}
        pad = jnp.zeros(r.shape[:-1] + (1,), r.dtype)
        v = d * r + jnp.concatenate([e[1:], jnp.zeros((1,), e.dtype)]) * jnp.concatenate(
            [r[..., 1:], pad], axis=-1
        )
        return _gaussian_log_density(jnp.sum(v * v, axis=-1), jnp.sum(jnp.log(d)), d.shape[0])


BLOCK_SOLVERS: dict[str, BlockSolver] = {
    s.name: s for s in (WeightSpace(), FunctionSpace(), Markov())
}
