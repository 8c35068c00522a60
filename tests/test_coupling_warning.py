"""The post-fit warning for latents q keeps independent although the posterior couples
them (``autocvi.infer.coupling``). Oracles: a Gaussian posterior, where the mean-field
optimum's sds are exactly ``1 / sqrt(P_ii)`` and the marginals' ``sqrt((P^-1)_ii)``; and
a Gamma-Poisson hierarchy whose two hyperparameters NUTS correlates at 0.94."""

import re
import warnings

import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import autocvi
from autocvi.infer.convergence import FitWarning

pytestmark = pytest.mark.float64


def sum_of_two(y=None):
    x = numpyro.sample("x", dist.Normal(0.0, 1.0))
    z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(x + z, 0.3), obs=y)


def fit_catching(model, data, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = autocvi.fit(model, data, progress_bar=False, **kwargs)
    return result, [str(w.message) for w in caught if issubclass(w.category, FitWarning)]


def test_mean_field_gaussian_warns_with_the_exact_shrinkage():
    """x + z observed: the posterior precision is [[1 + a, a], [a, 1 + a]] with
    a = 1 / 0.3^2. Mean-field (structure="mean-field") reaches sds 1 / sqrt(1 + a); the
    marginals are sqrt((1 + a) / (1 + 2a)). The warning must say so, and name both."""
    result, messages = fit_catching(sum_of_two, {"y": 1.0}, structure="mean-field")
    a = 1.0 / 0.3**2
    exact_ratio = np.sqrt(1.0 / (1.0 + a)) / np.sqrt((1.0 + a) / (1.0 + 2.0 * a))
    q_ratio = float(np.sqrt(result.posterior["x"].variance)) / np.sqrt((1 + a) / (1 + 2 * a))
    assert q_ratio == pytest.approx(exact_ratio, rel=1e-3)  # the fit is the mean-field optimum
    assert len(messages) == 2
    for site, other in (("x", "z"), ("z", "x")):
        (line,) = [m for m in messages if m.startswith(f"q treats {site!r}")]
        assert f"independent of {other!r}" in line
        stated = float(re.search(r"sd is likely about ([0-9.]+)", line).group(1))
        assert stated == pytest.approx(exact_ratio, abs=0.006)  # printed to 2 decimals
        corr = float(re.search(r"correlates them at ([-+0-9.]+)", line).group(1))
        assert corr == pytest.approx(-a / (1 + a), abs=0.006)


def test_joint_q_does_not_warn():
    """Completeness: the default joint Gaussian represents the coupling (exact q)."""
    result, messages = fit_catching(sum_of_two, {"y": 1.0})
    assert messages == []
    a = 1.0 / 0.3**2
    assert float(result.posterior["x"].variance) == pytest.approx((1 + a) / (1 + 2 * a), rel=1e-4)


def gamma_poisson(g, exposure, y=None, log_normal=False):
    if log_normal:
        alpha = numpyro.sample("alpha", dist.LogNormal(0.0, 1.5))
        beta = numpyro.sample("beta", dist.LogNormal(0.0, 1.0))
    else:
        alpha = numpyro.sample("alpha", dist.Exponential(0.5))
        beta = numpyro.sample("beta", dist.Gamma(2.0, 1.0))
    with numpyro.plate("G", 40):
        lam = numpyro.sample("lam", dist.Gamma(alpha, beta))
    with numpyro.plate("N", g.shape[0]):
        numpyro.sample("y", dist.Poisson(lam[g] * exposure), obs=y)


def gamma_poisson_data():
    rs = np.random.RandomState(0)
    g = np.repeat(np.arange(40), 10)
    exposure = rs.uniform(0.5, 2.0, size=400)
    y = rs.poisson(rs.gamma(3.0, 1 / 1.5, size=40)[g] * exposure)
    return {"g": g, "exposure": exposure, "y": y}


@pytest.mark.slow
def test_gamma_hyperparameters_of_a_hierarchy_warn_and_the_advice_works():
    """Exponential/Gamma priors: alpha and beta are mean-field Gamma nodes, NUTS
    correlates them at 0.94 and q's sds are about 0.25 of NUTS's (1.10, 0.67): the fit
    must say so. The advice (LogNormal priors) gives one joint Gaussian: no warning."""
    data = gamma_poisson_data()
    _, messages = fit_catching(gamma_poisson, data)
    assert any(m.startswith("q treats 'alpha' as independent of 'beta'") for m in messages)
    result, messages = fit_catching(gamma_poisson, {**data, "log_normal": True})
    assert not any("independent of" in m for m in messages)
    assert any({"alpha", "beta"} <= set(g.member_names) for g in result.schedule.joint)
