"""Structured Gaussian solvers against dense linear algebra (x64, to 1e-8)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from autocvi.blocks import solvers as gs

pytestmark = pytest.mark.float64


def _sites(key, n, zero_some=False):
    k1, k2 = jax.random.split(key)
    lam1 = jax.random.normal(k1, (n,))
    lam2 = -0.5 * jnp.exp(jax.random.normal(k2, (n,)))
    if zero_some:  # sites without curvature (W = 0) must be handled too
        lam2 = lam2.at[::3].set(0.0)
    return lam1, lam2


def _problem(n, d, seed):
    key = jax.random.PRNGKey(seed)
    ka, kb, km, kl, ks = jax.random.split(key, 5)
    A = jax.random.normal(ka, (n, d))
    b = jax.random.normal(kb, (n,))
    m0 = jax.random.normal(km, (d,))
    raw = jax.random.normal(kl, (d, d)) / np.sqrt(d)
    L0 = jnp.tril(raw, -1) + jnp.diag(0.5 + jnp.abs(jnp.diag(raw)))
    lam1, lam2 = _sites(ks, n, zero_some=True)
    return A, b, m0, L0, lam1, lam2


def _close(x, y):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("n,d", [(30, 8), (8, 30), (12, 12)])
def test_weight_and_function_space_equal_dense(n, d):
    A, b, m0, L0, lam1, lam2 = _problem(n, d, seed=n * 100 + d)
    mean, cov, ref = gs.dense_reference(m0, L0 @ L0.T, A, b, lam1, lam2)
    At, mf = A @ L0, A @ m0 + b
    ws, (mean_u, chol) = gs.weight_space(At, mf, lam1, lam2)
    fs, (alpha, s, C) = gs.function_space(At, mf, lam1, lam2)
    for got in (ws, fs):
        _close(got.mean, ref.mean)
        _close(got.var, ref.var)
        _close(got.log_normaliser, ref.log_normaliser)
    _close(m0 + L0 @ mean_u, mean)
    _close(m0 + L0 @ (At.T @ alpha), mean)
    # Marginal variances of u without a D x D matrix.
    cov_u = jnp.linalg.solve(L0, jnp.linalg.solve(L0, cov).T).T
    _close(gs.function_space_weights(At, s, C), jnp.diag(cov_u))
    # KL(q || p0) equals the Gaussian KL: each solver's own cancellation-free form and
    # the generic one from the sites and log Z.
    kl_dense = _gaussian_kl(mean, cov, m0, L0 @ L0.T)
    for got in (ws, fs):
        assert got.kl is not None
        _close(gs.kl_from_sites(got, lam1, lam2), kl_dense)
        _close(gs.kl_from_sites(got._replace(kl=None), lam1, lam2), kl_dense)


def _gaussian_kl(m1, S1, m0, S0):
    d = m1.shape[0]
    S0inv = jnp.linalg.inv(S0)
    diff = m0 - m1
    return 0.5 * (
        jnp.trace(S0inv @ S1)
        + diff @ S0inv @ diff
        - d
        + jnp.linalg.slogdet(S0)[1]
        - jnp.linalg.slogdet(S1)[1]
    )


def test_function_space_sampler_has_the_posterior_covariance():
    A, b, m0, L0, lam1, lam2 = _problem(6, 20, seed=3)
    At, mf = A @ L0, A @ m0 + b
    _, (alpha, s, C) = gs.function_space(At, mf, lam1, lam2)
    draws = gs.function_space_sample(jax.random.PRNGKey(0), At, alpha, s, C, 200_000)
    B = jnp.eye(20) + At.T @ ((-2 * lam2)[:, None] * At)
    cov_u = jnp.linalg.inv(B)
    np.testing.assert_allclose(np.cov(np.asarray(draws).T), cov_u, atol=0.02)
    np.testing.assert_allclose(draws.mean(0), At.T @ alpha, atol=0.01)


def _random_walk_precision(t, scale):
    diag = jnp.full((t,), 2.0).at[-1].set(1.0) / scale**2
    off = jnp.full((t,), -1.0).at[0].set(0.0) / scale**2
    return diag, off


def _dense_tridiagonal(diag, off):
    return jnp.diag(diag) + jnp.diag(off[1:], -1) + jnp.diag(off[1:], 1)


@pytest.mark.parametrize("kind", ["random_walk", "ar1"])
def test_markov_solver_equals_dense(kind):
    t = 60
    key = jax.random.PRNGKey(7)
    if kind == "random_walk":
        q_diag, q_off = _random_walk_precision(t, 0.3)
        h = jnp.zeros(t)
    else:  # stationary AR(1) with phi = 0.8, non-zero mean
        phi, s2 = 0.8, 0.5
        q_diag = jnp.full((t,), (1 + phi**2) / s2).at[jnp.array([0, -1])].set(1 / s2)
        q_off = jnp.full((t,), -phi / s2).at[0].set(0.0)
        h = _dense_tridiagonal(q_diag, q_off) @ jnp.full((t,), 1.5)
    ka, kb, ks = jax.random.split(key, 3)
    a = 1.0 + 0.3 * jax.random.normal(ka, (t,))
    b = jax.random.normal(kb, (t,))
    lam1, lam2 = _sites(ks, t, zero_some=True)
    Q = _dense_tridiagonal(q_diag, q_off)
    prior_cov = jnp.linalg.inv(Q)
    mean, cov, ref = gs.dense_reference(prior_cov @ h, prior_cov, jnp.diag(a), b, lam1, lam2)
    got, (chol, mean_x) = gs.markov(q_diag, q_off, h, a, b, lam1, lam2)
    _close(got.mean, ref.mean)
    _close(got.var, ref.var)
    _close(got.log_normaliser, ref.log_normaliser)
    mx, vx = gs.markov_posterior(chol, mean_x)
    _close(mx, mean)
    _close(vx, jnp.diag(cov))
    draws = gs.markov_sample(jax.random.PRNGKey(1), chol, mean_x, 100_000)
    np.testing.assert_allclose(np.cov(np.asarray(draws[:, :5]).T), cov[:5, :5], atol=0.02)


def test_markov_solver_is_linear_in_length():
    # T = 100,000 must run: only O(T) arrays are formed.
    t = 100_000
    q_diag, q_off = _random_walk_precision(t, 0.05)
    lam1, lam2 = jnp.zeros(t), -0.5 * jnp.ones(t)
    got, _ = jax.jit(gs.markov)(q_diag, q_off, jnp.zeros(t), jnp.ones(t), jnp.zeros(t), lam1, lam2)
    assert got.mean.shape == (t,) and bool(jnp.all(got.var > 0))
