"""Exact Gaussian computations for a latent with pseudo-likelihood sites.

A Gaussian node whose likelihood terms see it through linear predictors
``eta = A x + b`` keeps one site per term (CVI paper Alg. 1; t-SVGP Eq. 9):

    q(x) ∝ p0(x) prod_n exp(lam1_n eta_n + lam2_n eta_n^2),   W_n = -2 lam2_n >= 0,

so every CVI step is a Bayesian linear regression on pseudo-observations
``lam1_n / W_n`` with noise variance ``1 / W_n`` (CVI paper Sec. 4, App. E).
The functions here solve that regression with the linear algebra suited to
its structure. All of them return :class:`SiteMarginals`: the posterior means
and variances of every ``eta_n`` and ``log Z``, the log normaliser
``log E_{p0}[prod_n exp(...)]``, from which ``KL(q || p0) = E_q[sites] - log Z``.

* :func:`weight_space` — ``D x D`` Cholesky of ``I + At^T W At`` (``D <= N``).
* :func:`function_space` — ``N x N`` Cholesky of ``I + W^1/2 K W^1/2`` with
  ``K = At At^T`` (Woodbury; Khan et al. 2015 "KL-proximal", Eq. 19;
  Rasmussen & Williams Alg. 3.2). Never forms a ``D x D`` matrix nor ``K^-1``.
* :func:`markov` — a tridiagonal prior precision (a Markov chain such as a
  Gaussian random walk or an AR(1) process) with sites on single states:
  bidiagonal Cholesky, forward/back substitution and Takahashi's selected
  inversion, all ``O(T)`` scans. This is Kalman filtering plus RTS smoothing
  written on the precision matrix (CVI paper App. E.2).

Here ``At = A L0`` with ``x = m0 + L0 u`` and ``u ~ N(0, I)`` a priori (a
whitened prior), and ``mf = A m0 + b`` is the prior mean of ``eta``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import cho_solve, solve_triangular

__all__ = [
    "SiteMarginals",
    "weight_space",
    "function_space",
    "markov",
    "markov_posterior",
    "bidiagonal_solve_lower",
    "dense_reference",
    "kl_from_sites",
]


class SiteMarginals(NamedTuple):
    """Posterior marginals of the linear predictors and the log normaliser."""

    mean: jax.Array  # (N,) E_q[eta_n]
    var: jax.Array  # (N,) Var_q[eta_n]
    log_normaliser: jax.Array  # log Z = log E_{p0}[prod_n site_n(eta_n)]
    # KL(q || p0) in a form without cancellation, where the solver has one (None: from
    # the sites and log Z, :func:`kl_from_sites`)
    kl: jax.Array | None = None


def _site_constant(mf, lam1, lam2):
    """The part of log Z contributed by evaluating the sites at the prior mean."""
    return jnp.sum(lam1 * mf + lam2 * mf * mf)


def weight_space(At, mf, lam1, lam2):
    """Sites on ``eta = mf + At u``, ``u ~ N(0, I_D)``, solved with a D x D Cholesky.

    Posterior precision of u: ``B = I + At^T W At``; mean ``B^-1 At^T (lam1 - W mf)``.
    Returns the marginals and ``(mean_u, chol_B)`` for posterior draws.
    """
    W = -2.0 * lam2
    d = At.shape[1]
    B = jnp.eye(d, dtype=At.dtype) + At.T @ (W[:, None] * At)
    C = jnp.linalg.cholesky(B)
    r = At.T @ (lam1 - W * mf)
    mean_u = cho_solve((C, True), r)
    V = solve_triangular(C, At.T, lower=True)  # (D, N)
    log_z = (
        _site_constant(mf, lam1, lam2)
        - jnp.sum(jnp.log(jnp.diagonal(C)))
        + 0.5 * jnp.dot(r, mean_u)
    )
    var = jnp.sum(V * V, axis=0)
    kl = _whitened_kl(jnp.dot(mean_u, mean_u), C, W, var)
    return SiteMarginals(mf + At @ mean_u, var, log_z, kl), (mean_u, C)


def _whitened_kl(mean_norm2, chol, W, var):
    """``KL(q || N(0, I))`` of the whitened coordinates u, ``eta = mf + At u``, with
    ``q(u) = N(mu, B^-1)``: ``(|mu|^2 + log|B| - sum_n W_n Var_q[eta_n]) / 2``.

    The textbook ``(tr B^-1 + |mu|^2 - D + log|B|) / 2`` with ``tr B^-1 = D - sum_n W_n
    Var_q[eta_n]`` (``B = I + At^T W At``; the same with ``log|I + s K s|`` by Sylvester's
    identity in function space). Every term is O(D): the generic form, E_q[log sites] -
    log Z, subtracts two sums of size ``sum_n lam1_n m_n`` (3e8 for a Poisson GLM of
    counts near 12,000), which float32 rounds to tens of nats, and the line search
    refused the steps of the last 1.2 posterior sd as losses."""
    log_det = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))
    return 0.5 * (mean_norm2 + log_det - jnp.sum(W * var))


def function_space(At, mf, lam1, lam2, K=None):
    """Sites on ``eta = mf + At u`` solved with an N x N Cholesky (Woodbury form).

    ``K = At At^T`` is the prior covariance of ``eta``. With ``s = W^1/2`` and
    ``Bf = I + s K s`` (well conditioned for any kernel; R&W Alg. 3.2),
    ``alpha = rho - s Bf^-1 s K rho`` with ``rho = lam1 - W mf`` gives
    ``E[eta] = mf + K alpha`` and ``E[u] = At^T alpha`` (KL-prox Eq. 19).
    ``K`` may be passed precomputed (it does not change between steps).
    Returns the marginals and ``(alpha, s, chol_Bf)`` for posterior draws.
    """
    W = jnp.maximum(-2.0 * lam2, 0.0)
    s = jnp.sqrt(W)
    n = At.shape[0]
    K = At @ At.T if K is None else K
    Bf = jnp.eye(n, dtype=At.dtype) + s[:, None] * K * s[None, :]
    C = jnp.linalg.cholesky(Bf)
    rho = lam1 - W * mf
    K_rho = K @ rho
    alpha = rho - s * cho_solve((C, True), s * K_rho)
    V = solve_triangular(C, s[:, None] * K, lower=True)  # (N, N)
    var = jnp.diagonal(K) - jnp.sum(V * V, axis=0)
    log_z = (
        _site_constant(mf, lam1, lam2)
        - jnp.sum(jnp.log(jnp.diagonal(C)))
        + 0.5 * jnp.dot(K_rho, alpha)
    )
    K_alpha = K @ alpha
    kl = _whitened_kl(jnp.dot(alpha, K_alpha), C, W, var)
    return SiteMarginals(mf + K_alpha, var, log_z, kl), (alpha, s, C)


def function_space_weights(At, s, C):
    """Marginal variances of u (length D) without a D x D matrix: ``1 - colsum(V^2)``."""
    V = solve_triangular(C, s[:, None] * At, lower=True)  # (N, D)
    return 1.0 - jnp.sum(V * V, axis=0)


def function_space_sample(key, At, alpha, s, C, num_samples):
    """Draws of u from q by Matheron's rule, O(N D) per draw, no D x D matrix.

    ``u = E[u] + e0 - At^T s Bf^-1 (s At e0 + e)`` with ``e0 ~ N(0, I_D)``,
    ``e ~ N(0, I_N)`` has covariance ``I - At^T s Bf^-1 s At`` = Cov_q[u].
    """
    k0, k1 = jax.random.split(key)
    n, d = At.shape
    e0 = jax.random.normal(k0, (num_samples, d), At.dtype)
    e = jax.random.normal(k1, (num_samples, n), At.dtype)
    rhs = s * (e0 @ At.T) + e  # (S, N)
    corr = cho_solve((C, True), rhs.T).T * s
    return (At.T @ alpha)[None] + e0 - corr @ At


# ------------------------------------------------------------------ Markov
def _bidiagonal_cholesky(diag, off):
    """Cholesky ``P = L L^T`` of a tridiagonal SPD matrix.

    ``diag`` (T,) and ``off`` (T,) with ``off[t] = P[t, t-1]`` (``off[0]`` unused).
    Returns ``(d, e)``: ``L[t, t] = d[t]``, ``L[t, t-1] = e[t]``.
    """

    def body(d_prev, inputs):
        p_tt, p_off = inputs
        e = p_off / d_prev
        d = jnp.sqrt(p_tt - e * e)
        return d, (d, e)

    d0 = jnp.sqrt(diag[0])
    _, (d, e) = jax.lax.scan(body, d0, (diag[1:], off[1:]))
    return jnp.concatenate([d0[None], d]), jnp.concatenate([jnp.zeros((1,), diag.dtype), e])


def bidiagonal_solve_lower(d, e, b):
    """Solve ``L y = b`` for lower bidiagonal L (diagonal ``d``, subdiagonal ``e[1:]``)."""

    def body(y_prev, inputs):
        dt, et, bt = inputs
        y = (bt - et * y_prev) / dt
        return y, y

    y0 = b[0] / d[0]
    _, y = jax.lax.scan(body, y0, (d[1:], e[1:], b[1:]))
    return jnp.concatenate([y0[None], y])


def _solve_upper(d, e, y):
    """Solve ``L^T x = y`` for lower bidiagonal L (a backward scan)."""
    e_next = jnp.concatenate([e[1:], jnp.zeros((1,), e.dtype)])

    def body(x_next, inputs):
        dt, en, yt = inputs
        x = (yt - en * x_next) / dt
        return x, x

    _, x = jax.lax.scan(body, jnp.zeros((), y.dtype), (d, e_next, y), reverse=True)
    return x


def _selected_inverse_diagonal(d, e):
    """``diag(P^-1)`` from the bidiagonal Cholesky (Takahashi's recursion; RTS smoother).

    ``S[t,t] = 1/d_t^2 + (e_{t+1}/d_t)^2 S[t+1,t+1]``.
    """
    e_next = jnp.concatenate([e[1:], jnp.zeros((1,), e.dtype)])

    def body(s_next, inputs):
        dt, en = inputs
        s = 1.0 / (dt * dt) + (en / dt) ** 2 * s_next
        return s, s

    _, s = jax.lax.scan(body, jnp.zeros((), d.dtype), (d, e_next), reverse=True)
    return s


def markov_prior(q_diag, q_off, h):
    """Factorise a tridiagonal prior once: ``(chol, mean, log det Q, h^T Q^-1 h)``."""
    d, e = _bidiagonal_cholesky(q_diag, q_off)
    y = bidiagonal_solve_lower(d, e, h)
    mean = _solve_upper(d, e, y)
    return (d, e), mean, 2.0 * jnp.sum(jnp.log(d)), jnp.dot(y, y)


def markov(q_diag, q_off, h, a, b, lam1, lam2, prior=None):
    """Sites on single states, ``eta_t = a_t x_t + b_t``, of a tridiagonal-precision prior.

    The prior is ``p0(x) ∝ exp(-x^T Q x / 2 + h^T x)`` with ``Q[t,t] = q_diag[t]``,
    ``Q[t,t-1] = q_off[t]``. The posterior precision ``Q + diag(a^2 W)`` stays
    tridiagonal: one bidiagonal Cholesky, two substitutions and the selected
    inversion give the means, variances and ``log Z`` in ``O(T)``.
    Returns the marginals and ``(chol, mean_x)``.
    """
    if prior is None:
        prior = markov_prior(q_diag, q_off, h)
    _, _, logdet_q, hqh = prior
    W = -2.0 * lam2
    w = a * a * W
    info = h + a * (lam1 - W * b)
    d, e = _bidiagonal_cholesky(q_diag + w, q_off)
    y = bidiagonal_solve_lower(d, e, info)
    mean_x = _solve_upper(d, e, y)
    var_x = _selected_inverse_diagonal(d, e)
    log_z = (
        jnp.sum(lam1 * b + lam2 * b * b)
        + 0.5 * logdet_q
        - jnp.sum(jnp.log(d))
        + 0.5 * jnp.dot(y, y)
        - 0.5 * hqh
    )
    return SiteMarginals(a * mean_x + b, a * a * var_x, log_z), ((d, e), mean_x)


def markov_posterior(chol, mean_x):
    """Marginal variances of the states from the posterior's bidiagonal Cholesky."""
    d, e = chol
    return mean_x, _selected_inverse_diagonal(d, e)


def markov_sample(key, chol, mean_x, num_samples):
    """Draws ``x = mean + L^-T e`` (a backward scan per draw)."""
    d, e = chol
    z = jax.random.normal(key, (num_samples,) + mean_x.shape, mean_x.dtype)
    return mean_x[None] + jax.vmap(lambda zz: _solve_upper(d, e, zz))(z)


# --------------------------------------------------------------- references
def dense_reference(prior_mean, prior_cov, A, b, lam1, lam2):
    """The same posterior by dense linear algebra (tests only).

    Returns ``(mean_x, cov_x, SiteMarginals)`` with
    ``Cov = (Sigma0^-1 + A^T W A)^-1`` and ``mean = Cov (Sigma0^-1 m0 + A^T (lam1 - W b))``.
    """
    W = -2.0 * lam2
    p0 = jnp.linalg.inv(prior_cov)
    prec = p0 + A.T @ (W[:, None] * A)
    cov = jnp.linalg.inv(prec)
    info = p0 @ prior_mean + A.T @ (lam1 - W * b)
    mean = cov @ info
    eta_mean = A @ mean + b
    eta_var = jnp.einsum("nd,de,ne->n", A, cov, A)
    # log Z = log ∫ N(x; m0, S0) exp(sum lam1 eta + lam2 eta^2) dx
    _, logdet0 = jnp.linalg.slogdet(prior_cov)
    _, logdet = jnp.linalg.slogdet(cov)
    log_z = (
        jnp.sum(lam1 * b + lam2 * b * b)
        + 0.5 * (logdet - logdet0)
        + 0.5 * info @ mean
        - 0.5 * prior_mean @ p0 @ prior_mean
    )
    return mean, cov, SiteMarginals(eta_mean, eta_var, log_z)


def kl_from_sites(marginals: SiteMarginals, lam1, lam2):
    """``KL(q || p0) = E_q[sum_n lam1_n eta_n + lam2_n eta_n^2] - log Z``."""
    if marginals.kl is not None:
        return marginals.kl
    m, v = marginals.mean, marginals.var
    return jnp.sum(lam1 * m + lam2 * (m * m + v)) - marginals.log_normaliser
