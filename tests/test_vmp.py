"""The engine's exact messages are VMP messages: they match Bishop's PRML updates.

``autocvi.engine.step.vmp_message`` is what the engine sends along a conjugate
edge (``exact_message`` calls it), so these oracles test the engine's path.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax.scipy.special import digamma

import autocvi
from autocvi.engine.step import expected_log_factor, vmp_message

MU0, LAMBDA0, A0, B0 = 0.3, 0.5, 2.0, 1.5


def normal_gamma(x):
    tau = numpyro.sample("tau", dist.Gamma(A0, B0))
    mu = numpyro.sample("mu", dist.Normal(MU0, 1.0 / jnp.sqrt(LAMBDA0 * tau)))
    with numpyro.plate("N", x.shape[0]):
        numpyro.sample("x", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=x)


pytestmark = pytest.mark.float64


def _layouts(schedule):
    return {name: node.layout for name, node in schedule.nodes.items()}


@pytest.fixture(scope="module")
def x64():
    """Kept for the tests' signatures: precision is set by the marker (conftest.py)."""
    return None


def test_one_vmp_sweep_equals_bishop_10_26_to_10_30(x64):
    rng = np.random.RandomState(3)
    x = rng.normal(1.2, 0.7, size=40)
    n, xbar = x.size, x.mean()
    schedule = autocvi.plan(normal_gamma, {"x": jnp.asarray(x)}, structure="mean-field")
    graph, layouts = schedule.graph, _layouts(schedule)

    # A starting q: q(mu) = N(m, v), q(tau) = Gamma(a, b).
    m, v, a, b = 0.9, 0.05, 7.0, 3.0
    mu_mu = (jnp.asarray(m), jnp.asarray(m * m + v))
    mu_tau = (jnp.asarray(digamma(a) - np.log(b)), jnp.asarray(a / b))

    # Update q(mu) from the factors touching mu (Bishop 10.26, 10.27).
    means = {"mu": mu_mu, "tau": mu_tau}
    eta = [0.0, 0.0]
    for f in graph.factors_of("mu"):
        g = vmp_message(schedule.factors[f], layouts, "mu", means)
        eta = [eta[0] + g[0], eta[1] + g[1]]
    v_new = -0.5 / eta[1]
    m_new = eta[0] * v_new
    e_tau = a / b
    mu_n = (LAMBDA0 * MU0 + n * xbar) / (LAMBDA0 + n)
    lambda_n = (LAMBDA0 + n) * e_tau
    np.testing.assert_allclose(float(m_new), mu_n, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(float(1.0 / v_new), lambda_n, rtol=1e-10)

    # Update q(tau) from the new q(mu) (Bishop 10.29, 10.30).
    means = {"mu": (m_new, m_new**2 + v_new), "tau": mu_tau}
    eta = [0.0, 0.0]
    for f in graph.factors_of("tau"):
        g = vmp_message(schedule.factors[f], layouts, "tau", means)
        eta = [eta[0] + g[0], eta[1] + g[1]]
    a_new, b_new = eta[0] + 1.0, -eta[1]
    e_mu, e_mu2 = float(m_new), float(m_new**2 + v_new)
    a_n = A0 + (n + 1) / 2
    b_n = B0 + 0.5 * (
        np.sum(x**2)
        - 2 * e_mu * np.sum(x)
        + n * e_mu2
        + LAMBDA0 * (e_mu2 - 2 * MU0 * e_mu + MU0**2)
    )
    np.testing.assert_allclose(float(a_new), a_n, rtol=1e-10)
    np.testing.assert_allclose(float(b_new), b_n, rtol=1e-10)


def test_expected_log_factor_matches_monte_carlo(x64):
    x = jnp.asarray(np.random.RandomState(0).normal(size=25))
    schedule = autocvi.plan(normal_gamma, {"x": x}, structure="mean-field")
    fplan, layouts = schedule.factors["x"], _layouts(schedule)
    m, v, a, b = 0.4, 0.3, 3.0, 2.0
    means = {
        "mu": (jnp.asarray(m), jnp.asarray(m * m + v)),
        "tau": (jnp.asarray(digamma(a) - np.log(b)), jnp.asarray(a / b)),
    }
    key1, key2 = jax.random.split(jax.random.PRNGKey(0))
    mus = m + np.sqrt(v) * jax.random.normal(key1, (400_000,))
    taus = jax.random.gamma(key2, a, (400_000,)) / b
    mc = jnp.mean(
        jax.vmap(lambda mu, t: dist.Normal(mu, 1 / jnp.sqrt(t)).log_prob(x).sum())(mus, taus)
    )
    np.testing.assert_allclose(
        float(expected_log_factor(fplan, layouts, means)), float(mc), rtol=2e-3
    )


def test_non_conjugate_factor_has_no_exact_expectation():
    def logreg(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with numpyro.plate("N", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)

    schedule = autocvi.plan(logreg, {"X": jnp.ones((4, 2)), "y": jnp.ones(4)})
    with pytest.raises(ValueError, match="not conjugate in w"):
        expected_log_factor(schedule.factors["y"], _layouts(schedule), {})


def test_uniform_unit_prior_is_an_exact_beta():
    """``p ~ Uniform(0, 1)``, as users write a flat prior on a probability, is Beta(1, 1):
    VMP is exact. Oracle: the conjugate posterior Beta(1 + k, 1 + n - k) per group and
    the ELBO equal to the log marginal likelihood, sum_g log B(1 + k_g, 1 + n_g - k_g)."""
    from scipy.special import betaln

    rng = np.random.default_rng(3)
    groups, n = 4, 25
    y = (rng.random((groups, n)) < np.array([0.2, 0.5, 0.7, 0.9])[:, None]).astype(float)

    def model(y):
        with numpyro.plate("group", y.shape[0]):
            p = numpyro.sample("p", dist.Uniform(0.0, 1.0))
            with numpyro.plate("trial", y.shape[1]):
                numpyro.sample("y", dist.Bernoulli(probs=p[:, None].T), obs=y.T)

    result = autocvi.fit(model, {"y": y}, progress_bar=False)
    assert "exact" in str(result.schedule) and "monte-carlo" not in str(result.schedule)
    q, k = result.posterior["p"], y.sum(axis=1)
    np.testing.assert_allclose(q.concentration1, 1 + k, rtol=1e-5)
    np.testing.assert_allclose(q.concentration0, 1 + n - k, rtol=1e-5)
    assert result.elbo[-1] == pytest.approx(np.sum(betaln(1 + k, 1 + n - k)), rel=1e-5)
