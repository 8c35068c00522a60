"""Square-loss DLM (``autocvi.DLM(loss="square", beta)``) against its closed form.

The objective is ``1/2 sum_n (y_hat_n - y_n)^2 + beta KL(q || p)`` (Wei, Sheth & Khardon,
DLM for sparse GPs, Sec. 3), with ``y_hat_n`` the predictive mean. For a Gaussian prior
``N(mu0, S0)`` and a linear predictor ``Z w`` its minimiser has the prior's covariance
and the mean ``mu0 + S0 Z^T (Z S0 Z^T + beta I)^-1 (y - Z mu0)``: the posterior mean under
Gaussian noise of variance beta, whatever the likelihood's own noise scale.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import autocvi

NOISE = 0.5  # the likelihood's scale: square-loss DLM must not depend on it


def regression(X, y=None):
    """The common spelling: a feature plate and a separate intercept."""
    with numpyro.plate("features", X.shape[1]):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ w + b, NOISE), obs=y)


def regression_data(n=60, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = X @ np.array([1.0, -2.0, 0.5])[:d] + 0.3 + NOISE * rng.normal(size=n)
    return X, y


def closed_form(Z, S0, y, beta):
    return S0 @ Z.T @ np.linalg.solve(Z @ S0 @ Z.T + beta * np.eye(len(y)), y)


@pytest.mark.parametrize(
    "float64", [pytest.param(True, marks=pytest.mark.float64), False], ids=["f64", "f32"]
)
@pytest.mark.parametrize("beta", [0.1, 3.0])
def test_regression_reaches_the_closed_form_in_one_step(float64, beta):
    X, y = regression_data()
    result = autocvi.fit(
        regression, {"X": X, "y": y}, objective=autocvi.DLM(beta=beta, loss="square")
    )
    Z = np.concatenate([X, np.ones((len(y), 1))], axis=1)
    S0 = np.diag([1.0, 1.0, 1.0, 4.0])
    mean = closed_form(Z, S0, y, beta)
    tol = 1e-8 if float64 else 2e-4
    w, b = result.posterior["w"], result.posterior["b"]
    np.testing.assert_allclose(np.asarray(w.mean), mean[:3], rtol=tol, atol=tol)
    assert float(b.mean) == pytest.approx(mean[3], rel=tol, abs=tol)
    # The prior's covariance: the loss does not read q's variance.
    np.testing.assert_allclose(np.asarray(w.variance), 1.0, rtol=tol)
    assert float(b.variance) == pytest.approx(4.0, rel=tol)
    objective = -0.5 * np.sum((Z @ mean - y) ** 2) / beta - 0.5 * mean @ np.linalg.solve(S0, mean)
    assert float(result.elbo[0]) == pytest.approx(objective, rel=10 * tol)  # the first step
    assert result.converged and result.num_steps <= 5


@pytest.mark.float64
def test_gp_regression_mean_is_the_kernel_smoother_at_noise_beta():
    rng = np.random.default_rng(1)
    x = np.sort(rng.uniform(-3, 3, size=40))
    K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2) + 1e-6 * np.eye(40)
    y = np.sin(2 * x) + 0.2 * rng.normal(size=40)

    def gp(K, y=None):
        f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(K.shape[0]), K))
        numpyro.sample("y", dist.Normal(f, 0.2), obs=y)

    beta = 0.05
    result = autocvi.fit(gp, {"K": K, "y": y}, objective=autocvi.DLM(beta=beta, loss="square"))
    q = result.posterior["f"]
    np.testing.assert_allclose(np.asarray(q.mean), closed_form(np.eye(40), K, y, beta), atol=1e-6)
    np.testing.assert_allclose(np.asarray(q.covariance_matrix), K, atol=1e-6)


def test_refusals_name_the_site_and_the_fix():
    X, y = regression_data()

    def logistic(X, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("n", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)

    square = autocvi.DLM(beta=1.0, loss="square")
    with pytest.raises(NotImplementedError, match="'y' is Bernoulli.*loss='log'"):
        autocvi.plan(logistic, {"X": X, "y": (y > 0).astype(float)}, objective=square)

    def no_intercept(X, y=None):
        with numpyro.plate("features", X.shape[1]):
            w = numpyro.sample("w", dist.Normal(0.0, 1.0))
        with numpyro.plate("n", X.shape[0]):
            numpyro.sample("y", dist.Normal(X @ w, NOISE), obs=y)

    # Mean-field over the feature plate: w is no block, so nothing would solve it.
    with pytest.raises(NotImplementedError, match="'y' reads 'w'.*not a Gaussian block"):
        autocvi.plan(no_intercept, {"X": X, "y": y}, objective=square, structure="mean-field")
    with pytest.raises(NotImplementedError, match="several latents"):
        autocvi.plan(regression, {"X": X, "y": y}, objective=square, structure="mean-field")
    with pytest.raises(ValueError, match="closed-form gradient"):
        autocvi.DLM(beta=1.0, loss="square", gradient="bmc")


@pytest.mark.parametrize(
    "make",
    [autocvi.BetaELBO, autocvi.DLM, lambda b: autocvi.DLM(b, loss="square")],
    ids=["beta-elbo", "dlm-log", "dlm-square"],
)
def test_another_beta_compiles_nothing(make):
    """beta is an input of the compiled programs, not a literal in them: a grid of betas
    (choose_beta) compiles once. Completeness: the fits differ, so beta did reach them."""
    from autocvi.jaxpr import program_cache_info

    X, y = regression_data(n=40)
    first = autocvi.fit(regression, {"X": X, "y": y}, objective=make(0.5))
    misses = program_cache_info()["misses"]
    second = autocvi.fit(regression, {"X": X, "y": y}, objective=make(2.0))
    assert program_cache_info()["misses"] == misses
    assert abs(float(first.posterior["b"].mean) - float(second.posterior["b"].mean)) > 1e-3
