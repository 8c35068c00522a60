"""Monte Carlo messages to a joint Gaussian, against an exact posterior.

Oracle: a linear regression with a latent noise scale, written as users write it
(feature plate, separate intercept, HalfNormal sigma). Given sigma the posterior of
(b, w) is Gaussian in closed form, and p(sigma | y) is known up to a constant, so
the exact posterior mean and sd of (b, w) follow by quadrature over sigma.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy.stats import halfnorm

import autocvi


def regression(X, y=None):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("features", X.shape[1]):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Normal(b + X @ w, sigma), obs=y)


def _collinear(n=2000, d=10):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 3)) @ rng.normal(size=(3, d)) + 0.1 * rng.normal(size=(n, d))
    X = (X - X.mean(0)) / X.std(0)
    y = X[:, :3] @ np.array([1.0, -0.5, 0.25]) + 0.5 * rng.normal(size=n)
    return X, y


def exact_posterior(X, y):
    """Mean and sd of (b, w): a mixture over a fine sigma grid of the Gaussian
    posteriors given sigma, weighted by p(sigma | y) (w and b integrated out)."""
    n, d = X.shape
    A = np.hstack([np.ones((n, 1)), X])
    grid = np.linspace(0.3, 0.8, 801)
    logp, means, covs = [], [], []
    for s in grid:
        precision = A.T @ A / s**2 + np.eye(d + 1)
        cov = np.linalg.inv(precision)
        m = cov @ A.T @ y / s**2
        logdet = np.linalg.slogdet(precision)[1]
        logp.append(
            -0.5 * (y @ y / s**2 - m @ precision @ m)
            - n * np.log(s)
            - 0.5 * logdet
            + halfnorm.logpdf(s)
        )
        means.append(m)
        covs.append(cov)
    weight = np.exp(np.asarray(logp) - max(logp))
    weight /= weight.sum()
    means, covs = np.asarray(means), np.asarray(covs)
    mean = weight @ means
    second = np.einsum("g,gij->ij", weight, covs) + np.einsum("g,gi,gj->ij", weight, means, means)
    assert weight[0] < 1e-12 and weight[-1] < 1e-12  # the grid holds the posterior of sigma
    return mean, np.sqrt(np.diag(second) - mean**2)


@pytest.mark.slow  # CI runs it; the default run stays well under 10 minutes
def test_antithetic_draws_make_the_gaussian_likelihoods_message_exact():
    """The Bonnet/Price gradient of a factor quadratic in q's coordinates carries the
    noise H (mean(x) - m); with N = 2,000 collinear rows that kept q's means 0.05 sd
    from the posterior (0.1 on the zoo's 25-predictor regression). Antithetic pairs
    cancel it: q's means must be within 0.025 exact-posterior sd, its sds within 5%."""
    X, y = _collinear()
    mean, sd = exact_posterior(X, y)
    data = {"X": jnp.asarray(X, jnp.float32), "y": jnp.asarray(y, jnp.float32)}
    result = autocvi.fit(regression, data, progress_bar=False)
    assert result.converged
    (node,) = result.schedule.nodes
    assert {kind for _, kind in result.schedule.nodes[node].incoming} >= {"monte-carlo"}
    draws = result.sample(jax.random.PRNGKey(0), 20000)
    q = np.concatenate([np.asarray(draws["b"])[:, None], np.asarray(draws["w"])], axis=1)
    z = np.abs(q.mean(0) - mean) / sd
    assert z.max() < 0.025, z
    np.testing.assert_allclose(q.std(0) / sd, 1.0, atol=0.05)
