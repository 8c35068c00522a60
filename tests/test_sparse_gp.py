"""Sparse GPs written with the projection ``f = Kfu Kuu^-1 u`` (issue 15, oracles of item 4).

``jnp.linalg.solve(Kuu, u)`` is a ``custom_linear_solve`` in the jaxpr; the analysis sees
through it (its value is the LU solve it runs, linear in ``u`` for a constant ``Kuu``), so
a Gaussian likelihood is conjugate to q(u). Oracles: Titsias's collapsed optimum q*(u)
(one CVI step with step size 1 reaches it), the DTC log marginal likelihood (the ELBO of
this spelling at that q), and the full GP when the inducing inputs are the training inputs.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints
from scipy.stats import multivariate_normal

import autocvi

pytestmark = pytest.mark.float64

LENGTHSCALE, NOISE = 0.8, 0.3


def kernel(a, b):
    return np.exp(-0.5 * (a[:, None] - b[None, :]) ** 2 / LENGTHSCALE**2)


def data(n=80):
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(-3, 3, n))
    return x, np.sin(2 * x) + NOISE * rng.normal(size=n)


def sparse_gp(Kuu, Kfu, y=None):
    """How an SVGP user writes the projection: inducing values u, f = Kfu Kuu^-1 u."""
    u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Kuu.shape[0]), Kuu))
    f = Kfu @ jnp.linalg.solve(Kuu, u)
    with numpyro.plate("data", Kfu.shape[0]):
        numpyro.sample("y", dist.Normal(f, NOISE), obs=y)


def test_one_step_gives_titsias_collapsed_posterior_and_the_dtc_evidence():
    x, y = data()
    z = np.linspace(-3, 3, 12)
    Kuu, Kfu = kernel(z, z) + 1e-6 * np.eye(12), kernel(x, z)
    schedule = autocvi.plan(sparse_gp, dict(Kuu=Kuu, Kfu=Kfu, y=y))
    assert "y (exact)" in str(schedule)  # the linear solve is seen through
    result = autocvi.fit(
        sparse_gp, dict(Kuu=Kuu, Kfu=Kfu, y=y), num_steps=1, tol=0, progress_bar=False
    )
    # Titsias (2009): q*(u) = N(Kuu Sigma Kuf y / s^2, Kuu Sigma Kuu), Sigma = (Kuu + Kuf Kfu / s^2)^-1
    sigma = np.linalg.inv(Kuu + Kfu.T @ Kfu / NOISE**2)
    q = result.posterior["u"]
    np.testing.assert_allclose(q.mean, Kuu @ sigma @ Kfu.T @ y / NOISE**2, atol=1e-8)
    np.testing.assert_allclose(q.covariance_matrix, Kuu @ sigma @ Kuu, atol=1e-8)
    Qff = Kfu @ np.linalg.solve(Kuu, Kfu.T)
    dtc = multivariate_normal(np.zeros(len(y)), Qff + NOISE**2 * np.eye(len(y))).logpdf(y)
    assert result.elbo[-1] == pytest.approx(dtc, abs=1e-6)


def test_inducing_inputs_at_the_training_inputs_give_the_full_gp():
    x, y = data(40)
    K = kernel(x, x) + 1e-6 * np.eye(len(x))
    result = autocvi.fit(sparse_gp, dict(Kuu=K, Kfu=K, y=y), progress_bar=False)
    assert result.converged
    full = K @ np.linalg.inv(K + NOISE**2 * np.eye(len(x)))
    np.testing.assert_allclose(result.posterior["u"].mean, full @ y, atol=1e-6)
    np.testing.assert_allclose(result.posterior["u"].covariance_matrix, K - full @ K, atol=1e-6)
    evidence = multivariate_normal(np.zeros(len(y)), K + NOISE**2 * np.eye(len(y))).logpdf(y)
    assert result.elbo[-1] == pytest.approx(evidence, abs=1e-5)


def test_a_solve_with_a_latent_matrix_is_not_called_conjugate():
    """Soundness: solve(tau K, u) = K^-1 u / tau is not Gamma-conjugate in a latent tau;
    the analysis must answer non-conjugate, not guess."""

    def model(K, y=None):
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
        u = numpyro.sample("u", dist.Normal(0.0, 1.0).expand([K.shape[0]]).to_event(1))
        numpyro.sample("y", dist.Normal(jnp.linalg.solve(tau * K, u), 1.0).to_event(1), obs=y)

    K = np.eye(3) + 0.1
    graph = autocvi.trace(model, dict(K=K, y=np.ones(3)))
    assert graph.edges[("y", "tau")].conjugate is False


def titsias_model(X, Z, y=None):
    """A sparse GP regression whose hyperparameters are learned: the projection plus
    Titsias's trace term as a ``numpyro.factor`` (it reads no latent), so the ELBO is
    the collapsed SVGP bound (Titsias 2009, Eq. 9) at the optimal q(u)."""
    lengthscale = numpyro.param("lengthscale", 1.0, constraint=constraints.positive)
    noise = numpyro.param("noise", 0.5, constraint=constraints.positive)

    def k(a, b):
        return jnp.exp(-0.5 * (a[:, None] - b[None, :]) ** 2 / lengthscale**2)

    Kuu = k(Z, Z) + 1e-6 * jnp.eye(Z.shape[0])
    Kfu = k(X, Z)
    A = jnp.linalg.solve(Kuu, Kfu.T).T
    u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Z.shape[0]), Kuu))
    numpyro.factor("trace_term", -0.5 * (X.shape[0] - jnp.sum(A * Kfu)) / noise**2)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(A @ u, noise), obs=y)


def titsias_bound(log_params, x, z, y):
    ell, s = np.exp(log_params)
    k = lambda a, b: np.exp(-0.5 * (a[:, None] - b[None, :]) ** 2 / ell**2)  # noqa: E731
    Kuu, Kfu = k(z, z) + 1e-6 * np.eye(len(z)), k(x, z)
    Qff = Kfu @ np.linalg.solve(Kuu, Kfu.T)
    fit = multivariate_normal(np.zeros(len(y)), Qff + s**2 * np.eye(len(y))).logpdf(y)
    return fit - 0.5 * (len(y) - np.trace(Qff)) / s**2


@pytest.mark.slow
def test_learned_sparse_gp_hyperparameters_maximise_the_titsias_bound():
    from scipy.optimize import minimize

    x, y = data(60)
    z = np.linspace(-3, 3, 8)
    result = autocvi.fit(titsias_model, dict(X=x, Z=z, y=y), progress_bar=False)
    best = minimize(
        lambda p: -titsias_bound(p, x, z, y),
        np.log([1.0, 0.5]),
        method="Nelder-Mead",
        options=dict(xatol=1e-10, fatol=1e-12, maxiter=4000),
    )
    assert result.converged
    assert float(result.params["lengthscale"]) == pytest.approx(np.exp(best.x[0]), rel=1e-3)
    assert float(result.params["noise"]) == pytest.approx(np.exp(best.x[1]), rel=1e-3)
    assert result.elbo[-1] == pytest.approx(-best.fun, abs=1e-6)
