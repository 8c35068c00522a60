"""Joint groups in affine coordinates when their curvature is beyond the working precision.

The user's model: a trend on an uncentred year (statsmodels' macrodata), written
as anyone writes it, in float32. Oracles: the closed-form Gaussian posterior and
evidence of the conjugate model (float64 numpy), numpy's own linear algebra for
the affine map.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import autocvi
from autocvi.analysis.precondition import needs_preconditioning, whitening_affine
from autocvi.infer.convergence import FitWarning

NOISE = 0.04
PRIOR_SD = np.array([100.0, 1.0])


def trend(t, y=None):
    a = numpyro.sample("a", dist.Normal(0.0, 100.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("n", t.shape[0]):
        numpyro.sample("y", dist.Normal(a + b * t, NOISE), obs=y)


def macrodata(centre=False):
    import statsmodels.api as sm

    df = sm.datasets.macrodata.load_pandas().data
    t = (df["year"] + (df["quarter"] - 1.0) / 4.0).to_numpy()
    y = np.log(df["realgdp"].to_numpy())
    return (t - t.mean() if centre else t), y


def closed_form(t, y):
    """Posterior mean and covariance of (a, b) and the log evidence, in float64."""
    X = np.stack([np.ones_like(t), t], axis=1)
    precision = np.diag(PRIOR_SD**-2.0) + X.T @ X / NOISE**2
    cov = np.linalg.inv(precision)
    mean = cov @ X.T @ y / NOISE**2
    marginal = NOISE**2 * np.eye(len(t)) + X @ np.diag(PRIOR_SD**2) @ X.T
    sign, logdet = np.linalg.slogdet(2 * np.pi * marginal)
    evidence = -0.5 * (logdet + y @ np.linalg.solve(marginal, y))
    return mean, cov, evidence


def test_an_uncentred_trend_in_float32_equals_the_closed_form_posterior():
    t, y = macrodata()
    data = {"t": jnp.asarray(t), "y": jnp.asarray(y)}
    mean, cov, evidence = closed_form(t, y)
    assert cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1]) < -0.9999  # the hard case

    result = autocvi.fit(trend, data, progress_bar=False)
    notes = " ".join(result.schedule.notes)
    assert "preconditioned" in notes, notes
    assert result.converged
    sd = np.sqrt(np.diag(cov))
    for k, name in enumerate("ab"):
        q = result.posterior[name]
        assert abs(float(q.mean) - mean[k]) < 0.02 * sd[k], name
        assert float(q.scale) == pytest.approx(sd[k], rel=0.02), name
    # The coupling itself: the predictor at the data's centre has a small sd that
    # only the joint q gets right (the marginals alone would give ~100x more).
    draws = result.sample(jax.random.PRNGKey(0), 20000)
    centre = np.asarray(draws["a"], np.float64) + np.asarray(draws["b"], np.float64) * t.mean()
    direction = np.array([1.0, t.mean()])
    assert np.std(centre) == pytest.approx(np.sqrt(direction @ cov @ direction), rel=0.05)
    # The ELBO of the exact posterior is the evidence (the affine map's log-determinant
    # is part of the rewritten model's density).
    assert result.elbo_final == pytest.approx(evidence, abs=0.1)

    # Completeness: without the new coordinates float32 cannot fit it (it says so).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            plain = autocvi.fit(trend, data, progress_bar=False, precondition=False)
        except autocvi.IllConditionedError:
            return
    assert not plain.converged
    assert any(issubclass(w.category, FitWarning) for w in caught)


def test_a_centred_trend_keeps_its_coordinates():
    t, y = macrodata(centre=True)
    schedule = autocvi.plan(trend, {"t": jnp.asarray(t), "y": jnp.asarray(y)})
    assert [g.affine for g in schedule.joint] == [None]
    assert not any("preconditioned" in n for n in schedule.notes)


@pytest.mark.float64
def test_float64_needs_no_new_coordinates_and_is_right():
    t, y = macrodata()
    mean, cov, _ = closed_form(t, y)
    result = autocvi.fit(trend, {"t": jnp.asarray(t), "y": jnp.asarray(y)}, progress_bar=False)
    assert [g.affine for g in result.schedule.joint] == [None]
    for k, name in enumerate("ab"):
        assert float(result.posterior[name].mean) == pytest.approx(
            mean[k], abs=1e-3 * np.sqrt(cov[k, k])
        )


def test_guide_draws_keep_the_coupling():
    """``Predictive`` with autocvi's guide draws the preconditioned group jointly."""
    t, y = macrodata()
    data = {"t": jnp.asarray(t), "y": jnp.asarray(y)}
    _, cov, _ = closed_form(t, y)
    cvi = autocvi.CVI(trend)
    run = cvi.run(jax.random.PRNGKey(0), 200, **data)
    predictive = numpyro.infer.Predictive(
        trend, guide=cvi.guide(run.state), num_samples=4000, return_sites=["a", "b"]
    )
    draws = predictive(jax.random.PRNGKey(1), t=data["t"])
    corr = np.corrcoef(np.asarray(draws["a"], np.float64), np.asarray(draws["b"], np.float64))
    want = cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1])
    assert corr[0, 1] == pytest.approx(want, abs=2e-5)


@pytest.mark.float64
def test_the_affine_map_whitens_the_curvature():
    rng = np.random.default_rng(0)
    X = np.stack([np.ones(50), 2000.0 + rng.normal(size=50), rng.normal(size=50)], 1)
    h = X.T @ X + np.diag([1e-4, 1.0, 1.0])
    needed, condition = needs_preconditioning(h, jnp.float32)
    assert needed and condition == pytest.approx(np.linalg.cond(h), rel=1e-3)
    assert not needs_preconditioning(h, jnp.float64)[0]
    assert not needs_preconditioning(np.eye(3) + 0.1, jnp.float32)[0]
    affine = whitening_affine(h, np.array([1.0, 2.0, 3.0]), condition)
    p = affine.matrix
    np.testing.assert_allclose(p.T @ h @ p, np.eye(3), atol=1e-6)
    np.testing.assert_allclose(p @ affine.inverse, np.eye(3), atol=1e-8)
    assert affine.log_abs_det == pytest.approx(np.linalg.slogdet(p)[1], rel=1e-10)
    zeta = rng.normal(size=(4, 3))
    np.testing.assert_allclose(affine.backward(affine.forward(zeta)), zeta, atol=1e-8)


@pytest.mark.float64
def test_flat_directions_are_neither_counted_nor_stretched():
    """Coordinates the log joint does not read at the start (NumPyro's ``y_unobserved``
    at observed entries) are flat, not ill-conditioned: they do not trigger the map and
    keep unit scale in it."""
    h = np.zeros((3, 3))
    h[:2, :2] = [[2.0, 0.5], [0.5, 1.0]]
    assert not needs_preconditioning(h, jnp.float32)[0]
    affine = whitening_affine(h, np.zeros(3), 1.0)
    cov = affine.matrix @ affine.matrix.T  # what a unit Gaussian over zeta is over z
    np.testing.assert_allclose(cov[2], [0.0, 0.0, 1.0], atol=1e-12)
    np.testing.assert_allclose(cov[:2, :2], np.linalg.inv(h[:2, :2]), atol=1e-10)


def logistic_trend(t, y=None):
    a = numpyro.sample("a", dist.Normal(0.0, 10.0))
    b = numpyro.sample("b", dist.Normal(0.0, 10.0))
    with numpyro.plate("n", t.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=a + b * t), obs=y)


def grid_posterior(t, y):
    """Log evidence and posterior means of ``logistic_trend`` by a 301 x 301 grid in
    the Laplace-whitened coordinates (float64 numpy)."""

    def log_joint(w):  # w: (..., 2)
        eta = w[..., :1] + w[..., 1:] * t
        lik = np.sum(y * eta - np.logaddexp(0.0, eta), axis=-1)
        return lik - 0.5 * np.sum(w**2, -1) / 100.0 - np.log(2 * np.pi * 100.0)

    w = np.zeros(2)
    X = np.stack([np.ones_like(t), t], 1)
    for _ in range(50):  # Newton to the mode
        p = 1.0 / (1.0 + np.exp(-(X @ w)))
        hess = X.T @ (X * (p * (1 - p))[:, None]) + np.eye(2) / 100.0
        w = w + np.linalg.solve(hess, X.T @ (y - p) - w / 100.0)
    chol = np.linalg.cholesky(np.linalg.inv(hess))
    u = np.linspace(-8.0, 8.0, 301)
    grid = np.stack(np.meshgrid(u, u, indexing="ij"), -1).reshape(-1, 2)
    points = w + grid @ chol.T
    lj = log_joint(points)
    log_cell = np.log((u[1] - u[0]) ** 2) + np.linalg.slogdet(chol)[1]
    evidence = np.logaddexp.reduce(lj) + log_cell
    weights = np.exp(lj - np.logaddexp.reduce(lj))
    mean = weights @ points
    sd = np.sqrt(weights @ (points - mean) ** 2)
    return evidence, mean, sd


def test_a_logistic_trend_block_is_right_and_counts_its_coordinates_once():
    """The separate-intercept spelling on an uncentred year is a Gaussian block (weight
    space), which factorises its prior and sites itself: it keeps its coordinates, and its
    ELBO is bounded by the evidence (a block normalises its prior over its own
    coordinates, so a preconditioning map's log-determinant would be counted twice:
    7.4 nats above the evidence when it was)."""
    t, _ = macrodata()
    rng = np.random.default_rng(0)
    y = (rng.random(t.size) < 1.0 / (1.0 + np.exp(0.08 * (t - 1984.0)))).astype(np.float64)
    evidence, mean, sd = grid_posterior(t, y)
    data = {"t": jnp.asarray(t), "y": jnp.asarray(y)}
    result = autocvi.fit(logistic_trend, data, progress_bar=False)
    assert result.schedule.blocks and result.converged
    assert not any("preconditioned" in n for n in result.schedule.notes)
    # float32 rounding of a block with condition number ~1e10 moves the ELBO by ~0.03
    assert evidence - 0.1 <= result.elbo_final <= evidence + 0.05
    for k, name in enumerate("ab"):
        q = result.posterior[name]
        assert abs(float(q.mean) - mean[k]) < 0.05 * sd[k], name
        assert float(q.scale) == pytest.approx(sd[k], rel=0.05), name
