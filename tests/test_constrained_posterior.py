"""``posterior[site].mean`` / ``.variance`` of constrained sites (a HalfCauchy scale, a
Uniform probability): a Gaussian q pushed through the support's bijection
(:class:`autocvi.analysis.constrained.Constrained`). Oracles: the log-normal's closed
form, scipy's adaptive quadrature, and NumPyro's own ``TransformedDistribution``
(which has no mean) for everything else."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints
from numpyro.distributions.transforms import (
    ExpTransform,
    StickBreakingTransform,
    biject_to,
)
from scipy import integrate, stats

import autocvi
from autocvi.analysis.constrained import Constrained
from autocvi.infer.guide import marginal_moments


def lognormal_moments(m, s):
    return np.exp(m + s**2 / 2), (np.exp(s**2) - 1) * np.exp(2 * m + s**2)


@pytest.mark.parametrize(
    "float64", [pytest.param(True, marks=pytest.mark.float64), False], ids=["f64", "f32"]
)
def test_exp_matches_the_lognormal_closed_form(float64, precision):
    m = np.array([-2.0, 0.0, 1.5, 3.0])
    s = np.array([0.05, 0.5, 1.0, 2.5])
    q = Constrained(
        dist.Normal(jnp.asarray(m, precision), jnp.asarray(s, precision)), ExpTransform()
    )
    mean, var = lognormal_moments(m, s)
    rtol = 1e-9 if float64 else 2e-5
    np.testing.assert_allclose(np.asarray(q.mean), mean, rtol=rtol)
    np.testing.assert_allclose(np.asarray(q.variance), var, rtol=100 * rtol)


@pytest.mark.float64
def test_bounded_supports_match_adaptive_quadrature():
    """Sigmoid (a Uniform / Beta site) and exp plus a shift (greater_than), as biject_to
    builds them, against scipy.integrate.quad of g(x) N(x | m, s)."""
    cases = [
        (constraints.unit_interval, 0.7, 1.3),
        (constraints.interval(-2.0, 5.0), -0.4, 0.8),
        (constraints.greater_than(3.0), 0.2, 0.6),
        (constraints.positive, -1.0, 2.0),
    ]
    for support, m, s in cases:
        g = biject_to(support)
        q = Constrained(dist.Normal(m, s), g)

        def moment(k, g=g, m=m, s=s):
            f = lambda x: float(g(jnp.asarray(x))) ** k * stats.norm.pdf(x, m, s)  # noqa: E731
            return integrate.quad(f, m - 12 * s, m + 12 * s, epsabs=1e-13, limit=200)[0]

        mean = moment(1)
        assert float(q.mean) == pytest.approx(mean, rel=1e-8), support
        assert float(q.variance) == pytest.approx(moment(2) - mean**2, rel=1e-6), support


def test_mixing_transform_says_what_to_use_instead():
    q = Constrained(dist.Normal(jnp.zeros(2), 1.0).to_event(1), StickBreakingTransform())
    with pytest.raises(NotImplementedError, match="no closed form.*sample"):
        _ = q.mean
    # The guide's summaries still work: Monte Carlo.
    mean, std, how = marginal_moments(q)
    assert how == "monte carlo" and mean.shape == (3,)
    assert float(jnp.sum(mean)) == pytest.approx(1.0, abs=1e-5)


def test_correlated_base_gives_each_marginal():
    """A MultivariateNormal base (a joint group's vector of log-scales): each element's
    mean is its own marginal's log-normal mean."""
    cov = jnp.array([[0.5, 0.3], [0.3, 0.4]])
    q = Constrained(dist.MultivariateNormal(jnp.array([0.1, -0.2]), cov), ExpTransform())
    mean, var = lognormal_moments(np.array([0.1, -0.2]), np.sqrt(np.diag(np.asarray(cov))))
    np.testing.assert_allclose(np.asarray(q.mean), mean, rtol=2e-5)
    np.testing.assert_allclose(np.asarray(q.variance), var, rtol=2e-4)


def eight_schools(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def logistic_with_uniform_rate(x, y=None):
    p0 = numpyro.sample("p0", dist.Uniform(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("n", x.shape[0]):
        logit = jnp.log(p0) - jnp.log1p(-p0) + b * x
        numpyro.sample("y", dist.Bernoulli(logits=logit), obs=y)


@pytest.mark.parametrize("model_name", ["eight_schools", "uniform_rate"])
@pytest.mark.slow  # default run under budget (session 22)
def test_fit_posterior_of_constrained_sites_has_a_mean(model_name):
    """As a user asks for it: ``result.posterior["tau"].mean``, for a mean-field scale
    and for members of a joint group; against the mean of q's own draws."""
    if model_name == "eight_schools":
        model = eight_schools
        data = {
            "sigma": np.array([15.0, 10, 16, 11, 9, 11, 10, 18]),
            "y": np.array([28.0, 8, -3, 7, -1, 1, 18, 12]),
        }
        site = "tau"
    else:
        model = logistic_with_uniform_rate
        rng = np.random.default_rng(0)
        x = rng.normal(size=200)
        data = {"x": x, "y": (rng.random(200) < 1 / (1 + np.exp(-(0.5 + x)))).astype(float)}
        site = "p0"
    result = autocvi.fit(model, data, progress_bar=False)
    q = result.posterior[site]
    assert isinstance(q, Constrained)
    draws = np.asarray(q.sample(jax.random.PRNGKey(0), (200_000,)))
    se = draws.std() / np.sqrt(draws.size)
    assert abs(float(q.mean) - draws.mean()) < 5 * se
    assert float(q.variance) == pytest.approx(draws.var(), rel=0.03)
    summary_mean, _, how = marginal_moments(q)
    assert how == "quadrature" and float(summary_mean) == pytest.approx(float(q.mean))
