"""``BlockPosterior``: a Gaussian block's q in structured form, against dense oracles.

For every solver (weight-space with a diagonal and with a dense prior factor,
function-space, function-space on a whitened GP site, Markov) the block is
planned by ``autocvi.plan`` and given random sites; the oracle is the same
posterior formed densely in float64 numpy from the block's prior and predictor
(``Cov = (Sigma0^-1 + A^T W A)^-1``), mapped to the site's value. Then
``predictive_moments``, ``entropy``, ``log_prob`` and ``sample_with_log_prob``
are checked against numpy, scipy and numpyro's ``MultivariateNormal`` built from
that mean and covariance. Each case runs in float32 and in float64
(``tests/conftest.py``: the ``float64`` marker).
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import scipy.stats

import autocvi
from autocvi.blocks import BlockPosterior


def logistic(X, y=None):
    w = numpyro.sample("w", dist.Normal(0.5, 1.5).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def hierarchical(X, y=None):  # a joint group (b, w) with a dense prior precision
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    w = numpyro.sample("w", dist.Normal(b, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w + b), obs=y)


def gp(K, y=None):
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(K.shape[0]), K))
    with numpyro.plate("n", K.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def random_walk(T, y=None):
    x = numpyro.sample("x", dist.GaussianRandomWalk(0.3, num_steps=T))
    with numpyro.plate("t", T):
        numpyro.sample("y", dist.Poisson(jnp.exp(1.0 + x)), obs=y)


def _xy(n, d):
    X = jax.random.normal(jax.random.PRNGKey(0), (n, d)) / np.sqrt(d)
    return {"X": X, "y": (X[:, 0] > 0).astype(X.dtype)}


def _gp_data(n=12):
    X = np.random.default_rng(1).normal(size=(n, 2))
    K = 2.0 * np.exp(-0.5 * np.sum((X[:, None] - X[None]) ** 2, -1)) + 1e-2 * np.eye(n)
    return {"K": jnp.asarray(K), "y": jnp.asarray((X[:, 0] > 0).astype(float))}


CASES = {  # name: (model, data, site, solver)
    "weight-space": (logistic, lambda: _xy(40, 6), "w", "weight-space"),
    "weight-space-dense-prior": (hierarchical, lambda: _xy(30, 4), "b", "weight-space"),
    "function-space": (logistic, lambda: _xy(8, 30), "w", "function-space"),
    "function-space-whitened-gp": (gp, _gp_data, "f", "function-space"),
    "markov": (random_walk, lambda: {"T": 20, "y": jnp.arange(20.0) % 4}, "x", "markov"),
}


@pytest.fixture(params=["float32", pytest.param("float64", marks=pytest.mark.float64)])
def dtype(request):
    return request.param


def _dense_prior(block):
    """Prior mean and covariance of the block's x, and the stacked predictor (A, b)."""
    p = {k: np.asarray(v, np.float64) for k, v in block.prior.items() if k != "factored"}
    if block.solver == "markov":
        (term,) = block.terms
        Q = np.diag(p["q_diag"]) + np.diag(p["q_off"][1:], -1) + np.diag(p["q_off"][1:], 1)
        cov0 = np.linalg.inv(Q)
        A = np.diag(np.asarray(term.a, np.float64))
        return cov0 @ p["h"], cov0, A, np.asarray(term.b, np.float64)
    T0 = p["L0"] if "L0" in p else np.diag(p["sd0"])
    A = np.concatenate([np.asarray(t.A, np.float64) for t in block.terms])
    b = np.concatenate([np.asarray(t.b, np.float64) for t in block.terms])
    return p["m0"], T0 @ T0.T, A, b


def _setup(case):
    """(BlockPosterior at random sites, oracle mean and covariance of the site's value)."""
    model, data, site, solver = CASES[case]
    schedule = autocvi.plan(model, data())
    (name, block), *_ = schedule.blocks.items()
    assert block.solver == solver
    rng = np.random.default_rng(7)
    dtype = jnp.result_type(float)
    sites = {
        f: (
            jnp.asarray(rng.normal(size=lam1.shape), dtype),
            jnp.asarray(-0.5 * rng.uniform(0.2, 2.0, size=lam2.shape), dtype),
        )
        for f, (lam1, lam2) in block.init_sites().items()
    }
    m0, cov0, A, b = _dense_prior(block)
    lam1 = np.concatenate([np.asarray(sites[t.factor][0], np.float64) for t in block.terms])
    lam2 = np.concatenate([np.asarray(sites[t.factor][1], np.float64) for t in block.terms])
    W = -2.0 * lam2
    p0 = np.linalg.inv(cov0)
    cov = np.linalg.inv(p0 + A.T @ (W[:, None] * A))
    mean = cov @ (p0 @ m0 + A.T @ (lam1 - W * b))
    if block.layout.whitening is not None:  # site = loc + tril x
        loc, tril = (np.asarray(a, np.float64) for a in block.layout.whitening)
        mean, cov = loc + tril @ mean, tril @ cov @ tril.T
    return BlockPosterior(block, sites), mean, 0.5 * (cov + cov.T)


def _tol(dtype, scale=1.0):
    return (
        {"rtol": 1e-9, "atol": 1e-9 * scale}
        if dtype == "float64"
        else {
            "rtol": 2e-4,
            "atol": 2e-4 * scale,
        }
    )


@pytest.mark.parametrize("case", CASES)
def test_mean_and_predictive_moments_match_the_dense_posterior(case, dtype):
    q, mean, cov = _setup(case)
    np.testing.assert_allclose(np.ravel(q.mean), mean, **_tol(dtype, np.abs(mean).max()))
    np.testing.assert_allclose(np.ravel(q.variance), np.diag(cov), **_tol(dtype, cov.max()))
    A = np.random.default_rng(3).normal(size=(5, mean.size))
    m, v = q.predictive_moments(jnp.asarray(A, jnp.result_type(float)))
    assert m.shape == v.shape == (5,)
    np.testing.assert_allclose(m, A @ mean, **_tol(dtype, np.abs(A @ mean).max()))
    np.testing.assert_allclose(v, np.einsum("md,de,me->m", A, cov, A), **_tol(dtype, 10.0))
    m1, v1 = q.predictive_moments(jnp.asarray(A[0], jnp.result_type(float)))  # one row
    assert m1.shape == v1.shape == ()
    np.testing.assert_allclose([m1, v1], [m[0], v[0]], rtol=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_entropy_matches_scipy_and_numpyro(case, dtype):
    q, mean, cov = _setup(case)
    oracle = scipy.stats.multivariate_normal(mean, cov).entropy()
    np.testing.assert_allclose(float(q.entropy()), oracle, **_tol(dtype, mean.size))
    mvn = dist.MultivariateNormal(jnp.asarray(mean), jnp.asarray(cov))
    np.testing.assert_allclose(float(q.entropy()), float(mvn.entropy()), **_tol(dtype, mean.size))


@pytest.mark.parametrize("case", CASES)
def test_draws_come_with_their_exact_log_density(case, dtype):
    q, mean, cov = _setup(case)
    values, log_q = q.sample_with_log_prob(jax.random.PRNGKey(0), (4000,))
    assert values.shape == (4000,) + q.event_shape and log_q.shape == (4000,)
    flat = np.asarray(values, np.float64).reshape(4000, -1)
    oracle = scipy.stats.multivariate_normal(mean, cov).logpdf(flat)
    np.testing.assert_allclose(log_q, oracle, **_tol(dtype, mean.size))
    mvn = dist.MultivariateNormal(jnp.asarray(mean), jnp.asarray(cov))
    np.testing.assert_allclose(log_q, mvn.log_prob(jnp.asarray(flat)), **_tol(dtype, mean.size))
    # log_prob at the same values (the inverse map, e.g. the GP's whitening) agrees
    np.testing.assert_allclose(q.log_prob(values), log_q, **_tol(dtype, mean.size))
    # and the draws are q's: their mean is within 5 standard errors of q's mean
    se = np.sqrt(np.diag(cov) / 4000)
    assert np.all(np.abs(flat.mean(0) - mean) < 5 * se + 1e-5)


def test_log_prob_at_any_value_and_batch_shapes():
    q, mean, cov = _setup("function-space")
    x = np.random.default_rng(5).normal(size=(2, 3, mean.size))
    lp = q.log_prob(jnp.asarray(x, jnp.result_type(float)))
    assert lp.shape == (2, 3)
    oracle = scipy.stats.multivariate_normal(mean, cov).logpdf(x.reshape(-1, mean.size))
    np.testing.assert_allclose(np.ravel(lp), oracle, rtol=2e-4, atol=1e-2)
    values, log_q = q.sample_with_log_prob(jax.random.PRNGKey(1))
    assert values.shape == q.event_shape and log_q.shape == ()
