"""``autocvi.CVI``, ``CVIGuide`` and ``print_summary`` against NumPyro's conventions and closed forms.

Oracles: the closed-form posterior and log evidence of Bayesian linear
regression with known noise (Normal priors on the weights and the intercept,
which autocvi fits as one joint Gaussian), scipy's Normal
quantiles, NumPyro's own ``SVI`` + ``AutoNormal`` + ``Predictive`` for what a
guide returns, and Monte Carlo draws of q for the mapped quantiles.

Runs in float64 (the ``float64`` marker; ``tests/conftest.py`` decides precision).
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints
from numpyro.distributions import transforms as T
from numpyro.infer import SVI, Predictive, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from scipy.stats import multivariate_normal, norm

import autocvi
from autocvi.analysis import classify as classify_module
from autocvi.infer.guide import marginal_quantiles
from autocvi.plan import schedule as schedule_module

pytestmark = pytest.mark.float64

TAU, SIGMA, N, D = 2.0, 0.5, 40, 10


def linear(X, y=None):
    """y ~ N(X w + b, noise^2), w ~ N(0, TAU^2 I), b ~ N(0, TAU^2); noise a
    numpyro.param, held at SIGMA here (``learn_params=False``) for the closed form."""
    noise = numpyro.param("noise", jnp.asarray(SIGMA), constraint=constraints.positive)
    w = numpyro.sample("w", dist.Normal(0.0, TAU).expand([X.shape[1]]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, TAU))
    with numpyro.plate("N", X.shape[0]):
        return numpyro.sample("y", dist.Normal(X @ w + b, noise), obs=y)


def make_data(seed):
    rng = np.random.RandomState(seed)
    X = rng.randn(N, D) + 0.5  # non-centred columns: b and w are correlated a posteriori
    y = X @ rng.randn(D) + 1.0 + SIGMA * rng.randn(N)
    return X, y


def closed_form(X, y):
    """Posterior mean and covariance of (w, b) (b last), and the log evidence log p(y | X)."""
    Xa = np.c_[X, np.ones(len(X))]
    cov = np.linalg.inv(np.eye(D + 1) / TAU**2 + Xa.T @ Xa / SIGMA**2)
    mean = cov @ Xa.T @ y / SIGMA**2
    log_z = multivariate_normal(np.zeros(N), TAU**2 * Xa @ Xa.T + SIGMA**2 * np.eye(N)).logpdf(y)
    return mean, cov, log_z


def count_traces(monkeypatch):
    """Record every trace of a model (``plan`` traces through its own import)."""
    calls = []
    for module in (classify_module, schedule_module):
        original = module.trace

        def counting(*args, original=original, **kwargs):
            calls.append(1)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, "trace", counting)
    return calls


@pytest.fixture(scope="module")
def fitted():
    X, y = make_data(0)
    cvi = autocvi.CVI(linear, learn_params=False)
    result = cvi.run(jax.random.PRNGKey(0), 50, X, y=y)
    return cvi, X, y, result


def test_run_gives_closed_form(fitted):
    cvi, X, y, result = fitted
    mean, cov, log_z = closed_form(X, y)
    assert isinstance(result, autocvi.CVIRunResult)
    params, state, losses = result[:3]  # unpacks like numpyro's SVIRunResult
    q = cvi.get_posterior(state)
    np.testing.assert_allclose(q["w"].mean, mean[:D], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(q["w"].covariance_matrix, cov[:D, :D], rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(q["b"].mean, mean[D], rtol=1e-8)
    np.testing.assert_allclose(q["b"].variance, cov[D, D], rtol=1e-8)
    assert result.converged and result.num_steps == result.elbo.size == losses.size
    np.testing.assert_allclose(result.elbo[-1], log_z, rtol=1e-10)
    np.testing.assert_array_equal(losses, -result.elbo)  # NumPyro: loss = -ELBO
    # params: the model's numpyro.param values, as SVI.get_params (no hidden data sites)
    assert set(params) == {"noise"} and float(params["noise"]) == SIGMA
    assert cvi.get_params(state).keys() == params.keys()


def test_update_and_evaluate_agree_with_run(fitted):
    cvi, X, y, result = fitted
    state = cvi.init(jax.random.PRNGKey(1), X, y=y)
    assert isinstance(state, autocvi.CVIRunState)
    for _ in range(5):
        state, elbo = cvi.update(state, X, y=y)
    np.testing.assert_allclose(float(elbo), result.elbo[-1], rtol=1e-10)
    np.testing.assert_allclose(
        cvi.get_posterior(state)["w"].mean, closed_form(X, y)[0][:D], rtol=1e-8
    )
    # evaluate: the ELBO at the state (a step of size 0)
    assert cvi.evaluate(result.state, X, y=y) == pytest.approx(result.elbo[-1], rel=1e-10)
    assert isinstance(cvi.evaluate(state, X, y=y), float)


def test_positional_and_keyword_arguments(fitted):
    cvi, X, y, result = fitted
    expected = cvi.get_posterior(result.state)["w"].mean
    for args, kwargs in [((X, y), {}), ((), {"X": X, "y": y})]:
        r = cvi.run(jax.random.PRNGKey(0), 50, *args, **kwargs)
        np.testing.assert_allclose(cvi.get_posterior(r.state)["w"].mean, expected, rtol=1e-8)
    with pytest.raises(TypeError):
        cvi.run(jax.random.PRNGKey(0), 50, X, y, "extra")


def test_update_with_other_data_than_init(fitted):
    """The data-only messages the engine caches follow the data passed to update."""
    cvi, X, y, _ = fitted
    X1, y1 = make_data(1)
    state = cvi.init(jax.random.PRNGKey(0), X, y=y)
    for _ in range(3):
        state, _ = cvi.update(state, X1, y=y1)
    mean, cov, log_z = closed_form(X1, y1)
    np.testing.assert_allclose(cvi.get_posterior(state)["w"].mean, mean[:D], rtol=1e-8)
    assert cvi.evaluate(state, X1, y=y1) == pytest.approx(log_z, rel=1e-10)


def test_second_init_reuses_the_trace(fitted, monkeypatch):
    cvi, X, y, result = fitted
    calls = count_traces(monkeypatch)
    X2, y2 = make_data(2)
    state = cvi.init(jax.random.PRNGKey(0), X2, y=y2)
    r = cvi.run(None, 50, X2, y=y2, init_state=state)
    assert calls == []  # neither traced nor planned again
    assert r.state.plan == result.state.plan  # same plan and compiled functions
    mean, cov, log_z = closed_form(X2, y2)
    q = cvi.get_posterior(r.state)
    np.testing.assert_allclose(q["w"].mean, mean[:D], rtol=1e-8)
    np.testing.assert_allclose(q["w"].covariance_matrix, cov[:D, :D], rtol=1e-8)
    np.testing.assert_allclose(q["b"].mean, mean[D], rtol=1e-8)
    np.testing.assert_allclose(r.elbo[-1], log_z, rtol=1e-10)
    # the first state still gives its own posterior
    np.testing.assert_allclose(
        cvi.get_posterior(result.state)["w"].mean, closed_form(X, y)[0][:D], rtol=1e-8
    )
    # other shapes: traced again
    cvi.init(jax.random.PRNGKey(0), X2[:30], y=y2[:30])
    assert len(calls) >= 1


@pytest.mark.slow  # CI runs it; the default run stays well under 10 minutes
def test_predictive_like_autonormal(fitted):
    cvi, X, y, result = fitted
    n = 2000
    svi = SVI(linear, AutoNormal(linear), numpyro.optim.Adam(0.05), Trace_ELBO())
    svi_result = svi.run(jax.random.PRNGKey(0), 5, X, y=y, progress_bar=False)
    key = jax.random.PRNGKey(3)
    expected = Predictive(linear, guide=svi.guide, params=svi_result.params, num_samples=n)(key, X)
    guide = cvi.guide(result.state)
    got = Predictive(linear, guide=guide, params=result.params, num_samples=n)(key, X)
    assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in expected.items()}
    assert set(got) == {"y"}  # NumPyro returns the sites the guide did not sample
    got = Predictive(
        linear, guide=guide, params=result.params, num_samples=n, return_sites=["w", "b", "y"]
    )(key, X)
    assert got["w"].shape == (n, D) and got["b"].shape == (n,)
    assert got["y"].shape == expected["y"].shape == (n, N)
    # moments within Monte Carlo error of the closed form, correlations included
    # (w and b are one joint Gaussian, drawn together)
    mean, cov, _ = closed_form(X, y)
    sd = np.sqrt(np.diag(cov))
    wb = np.c_[np.asarray(got["w"]), np.asarray(got["b"])]
    assert np.all(np.abs(wb.mean(0) - mean) < 5 * sd / np.sqrt(n))
    assert np.all(np.abs(wb.std(0) / sd - 1) < 5 / np.sqrt(2 * n))
    corr = cov[:D, D] / sd[:D] / sd[D]
    assert np.max(np.abs(corr)) > 0.5
    sample_corr = np.corrcoef(wb, rowvar=False)[:D, D]
    assert np.all(np.abs(sample_corr - corr) < 5 * (1 - corr**2) / np.sqrt(n))
    # posterior predictive: y = X w + b + noise
    Xa = np.c_[X, np.ones(N)]
    pred_mean, pred_sd = Xa @ mean, np.sqrt(np.einsum("nd,de,ne->n", Xa, cov, Xa) + SIGMA**2)
    ys = np.asarray(got["y"])
    assert np.all(np.abs(ys.mean(0) - pred_mean) < 5 * pred_sd / np.sqrt(n))
    assert np.all(np.abs(ys.std(0) / pred_sd - 1) < 5 / np.sqrt(2 * n))
    # AutoGuide.sample_posterior's signature and shapes (joint draws too)
    samples = guide.sample_posterior(key, result.params, X, sample_shape=(n,))
    assert {k: v.shape for k, v in samples.items()} == {"w": (n, D), "b": (n,)}
    sample_corr = np.corrcoef(np.c_[samples["w"], samples["b"]], rowvar=False)[:D, D]
    assert np.all(np.abs(sample_corr - corr) < 5 * (1 - corr**2) / np.sqrt(n))


def test_quantiles_and_median_of_a_normal_q(fitted):
    cvi, X, y, result = fitted
    mean, cov, _ = closed_form(X, y)
    sd = np.sqrt(np.diag(cov))
    guide = cvi.guide(result.state)
    probs = [0.05, 0.25, 0.5, 0.95]
    quants = guide.quantiles(result.params, probs)
    assert quants["w"].shape == (len(probs), D) and quants["b"].shape == (len(probs),)
    expected = norm.ppf(np.asarray(probs)[:, None], mean, sd)
    np.testing.assert_allclose(quants["w"], expected[:, :D], rtol=1e-8)
    np.testing.assert_allclose(quants["b"], expected[:, D], rtol=1e-8)
    np.testing.assert_allclose(guide.median()["w"], mean[:D], rtol=1e-8)
    # params may also be a CVIRunState / CVIRunResult
    np.testing.assert_allclose(guide.median(result.state)["b"], mean[D], rtol=1e-8)
    np.testing.assert_allclose(guide.median(result)["w"], mean[:D], rtol=1e-8)


def scale_model(y):
    s = numpyro.sample("s", dist.HalfNormal(2.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(0.0, s), obs=y)


def test_quantiles_of_a_positive_site_are_mapped():
    y = 1.5 * np.random.RandomState(3).randn(30)
    cvi = autocvi.CVI(scale_model)
    state = cvi.init(jax.random.PRNGKey(0), y)
    for _ in range(30):  # Monte Carlo messages for s: SVI-style stepping
        state, elbo = cvi.update(state, y)
    assert np.isfinite(elbo)
    q = cvi.get_posterior(state)["s"]
    # q on the positive reals: a Normal pushed through exp (a log-normal)
    assert isinstance(q, dist.TransformedDistribution)
    assert isinstance(q.base_dist, dist.Normal)
    loc, scale = float(q.base_dist.loc), float(q.base_dist.scale)
    guide = cvi.guide(state)
    probs = np.array([0.05, 0.5, 0.95])
    quants = np.asarray(guide.quantiles(quantiles=probs)["s"])
    np.testing.assert_allclose(quants, np.exp(norm.ppf(probs, loc, scale)), rtol=1e-10)
    assert np.all(np.diff(quants) > 0)
    np.testing.assert_allclose(guide.median()["s"], np.exp(loc), rtol=1e-10)
    draws = np.asarray(q.sample(jax.random.PRNGKey(1), (8000,)))
    np.testing.assert_allclose(quants, np.quantile(draws, probs), rtol=0.02)
    # print_summary's moments: those of the log-normal
    stats = autocvi.infer.summary.summary(guide)["s"]
    np.testing.assert_allclose(stats["mean"], np.exp(loc + scale**2 / 2), rtol=1e-8)
    lognormal_var = (np.exp(scale**2) - 1) * np.exp(2 * loc + scale**2)
    np.testing.assert_allclose(stats["std"], np.sqrt(lognormal_var), rtol=1e-8)


def test_quantiles_through_a_decreasing_transform():
    """exp then x -> 1 - 2x: the tails swap; exact, against Monte Carlo."""
    base = dist.Normal(jnp.array([0.0, 0.5, -1.0]), jnp.array([1.0, 0.3, 0.8]))
    q = dist.TransformedDistribution(base, [T.ExpTransform(), T.AffineTransform(1.0, -2.0)])
    probs = np.array([0.05, 0.5, 0.95])
    values, exact = marginal_quantiles(q, probs)
    assert exact
    expected = 1.0 - 2.0 * np.exp(norm.ppf(1 - probs[:, None], base.loc, base.scale))
    np.testing.assert_allclose(values, expected, rtol=1e-10)
    assert np.all(np.diff(np.asarray(values), axis=0) > 0)
    draws = np.asarray(q.sample(jax.random.PRNGKey(0), (40000,)))
    np.testing.assert_allclose(values, np.quantile(draws, probs, axis=0), rtol=0.03, atol=0.01)
    # no exact route (no icdf): Monte Carlo, flagged as such
    values, exact = marginal_quantiles(dist.Categorical(jnp.array([0.2, 0.5, 0.3])), probs)
    assert not exact
    np.testing.assert_array_equal(values, [0, 1, 2])


def test_print_summary_prints_every_element(fitted, capsys):
    cvi, X, y, result = fitted
    mean, cov, _ = closed_form(X, y)
    sd = np.sqrt(np.diag(cov))
    autocvi.print_summary(cvi.get_posterior(result.state))
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[0] == ["mean", "std", "median", "5.0%", "95.0%"]
    rows = {line[0]: np.array(line[1:], dtype=float) for line in lines[1:]}
    assert list(rows) == [f"w[{i}]" for i in range(D)] + ["b"]  # all ten, in order
    for i, label in enumerate(rows):
        expected = [mean[i], sd[i], mean[i], *norm.ppf([0.05, 0.95], mean[i], sd[i])]
        np.testing.assert_allclose(rows[label], expected, atol=0.0051)
    # the guide prints the same table; another prob changes the interval columns
    autocvi.print_summary(cvi.guide(result.state), prob=0.5)
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["mean", "std", "median", "25.0%", "75.0%"] and len(out) == D + 4


def logistic(X, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def count_plans(monkeypatch):
    """Record every planning of a schedule from a cached trace (``CVI``'s re-plan)."""
    calls = []
    original = schedule_module.build_schedule

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(schedule_module, "build_schedule", counting)
    return calls


def test_gaussian_block_reads_new_data_without_planning_again(monkeypatch):
    """A Gaussian block's predictor matrix is read from the data in a compiled program:
    new data of the same shapes neither retrace, re-plan nor compile, and the fit is the
    one of a fresh ``autocvi.fit`` on those data (whose plan reads them when planned)."""
    rng = np.random.RandomState(4)
    X1, X2 = rng.randn(20, 2), rng.randn(20, 2)
    y1 = (X1 @ np.array([1.5, -1.0]) > 0).astype(float)
    y2 = (X2 @ np.array([-1.0, 2.0]) > 0).astype(float)
    cvi = autocvi.CVI(logistic)
    first = cvi.run(jax.random.PRNGKey(0), 100, X1, y=y1)
    assert cvi.get_schedule(first.state).blocks  # the case under test
    mean1 = cvi.get_posterior(first.state)["w"].mean
    traces, plans = count_traces(monkeypatch), count_plans(monkeypatch)
    compiled = autocvi.program_cache_info()["misses"]
    second = cvi.run(jax.random.PRNGKey(0), 100, X2, y=y2)
    assert traces == [] and plans == [] and second.state.plan == first.state.plan
    assert autocvi.program_cache_info()["misses"] == compiled
    q2 = cvi.get_posterior(second.state)["w"]
    monkeypatch.undo()
    fresh = autocvi.fit(logistic, {"X": X2, "y": y2}, progress_bar=False)
    np.testing.assert_allclose(q2.mean, fresh.posterior["w"].mean, rtol=1e-6)
    np.testing.assert_allclose(
        q2.covariance_matrix, fresh.posterior["w"].covariance_matrix, rtol=1e-6
    )
    np.testing.assert_allclose(second.elbo[-1], fresh.elbo_final, rtol=1e-8)
    # each posterior separates its own (separable) data; mixing one's X with the
    # other's y would give a mean of norm ~0.3 (checked with autocvi.fit)
    for mean, X, y in [(mean1, X1, y1), (q2.mean, X2, y2)]:
        assert np.mean((X @ mean > 0) == (y > 0)) >= 0.9 and np.linalg.norm(mean) > 1.5
    # the first state keeps its own data and posterior
    np.testing.assert_array_equal(cvi.get_posterior(first.state)["w"].mean, mean1)


def gp_classifier(X, y=None):
    """GP classification as users write it: a kernel built from the inputs."""
    sq = jnp.sum((X[:, None, :] - X[None, :, :]) ** 2, axis=-1)
    K = jnp.exp(-0.5 * sq) + 1e-5 * jnp.eye(X.shape[0])
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(X.shape[0]), K))
    numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def test_gp_kernel_inputs_are_data_inputs_too(monkeypatch):
    """New inputs of a GP (its kernel, read by the latent's own prior, moves with them)
    neither retrace, re-plan nor compile: the block reads its whitening and predictors
    from them, and the fit is the one of a fresh ``autocvi.fit`` on those data."""
    rng = np.random.RandomState(2)
    X1, X2 = rng.randn(30, 2), rng.randn(30, 2)
    y1, y2 = (X1[:, 0] > 0).astype(float), (X2[:, 1] > 0).astype(float)
    cvi = autocvi.CVI(gp_classifier)
    first = cvi.run(jax.random.PRNGKey(0), 100, X1, y=y1)
    assert cvi.get_schedule(first.state).blocks["f"].layout.whitening is not None
    traces, plans = count_traces(monkeypatch), count_plans(monkeypatch)
    compiled = autocvi.program_cache_info()["misses"]
    second = cvi.run(jax.random.PRNGKey(0), 100, X2, y=y2)
    assert traces == [] and plans == [] and second.state.plan == first.state.plan
    assert autocvi.program_cache_info()["misses"] == compiled
    monkeypatch.undo()
    # each state keeps its own data's posterior
    for run, X, y in [(second, X2, y2), (first, X1, y1)]:
        fresh = autocvi.fit(gp_classifier, {"X": X, "y": y}, progress_bar=False)
        q, q_fresh = cvi.get_posterior(run.state)["f"], fresh.posterior["f"]
        np.testing.assert_allclose(q.mean, q_fresh.mean, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(
            q.covariance_matrix, q_fresh.covariance_matrix, rtol=1e-6, atol=1e-9
        )
        np.testing.assert_allclose(run.elbo[-1], fresh.elbo_final, rtol=1e-8)


def test_a_posterior_on_new_data_is_built_without_tracing_again(monkeypatch):
    """``get_posterior`` keeps one compiled builder per plan, the data (the GP's kernel
    factor) its inputs: after new data of the same shapes it builds q without tracing the
    builder again, and each state's q is its own data's (oracle: a fresh ``fit``)."""
    import importlib

    cvi_module = importlib.import_module("autocvi.infer.cvi")
    fit_module = importlib.import_module("autocvi.infer.fit")  # not the function fit

    rng = np.random.RandomState(3)
    X1, X2 = rng.randn(30, 2), rng.randn(30, 2)
    y1, y2 = (X1[:, 0] > 0).astype(float), (X2[:, 1] > 0).astype(float)
    cvi = autocvi.CVI(gp_classifier)
    first = cvi.run(jax.random.PRNGKey(0), 100, X1, y=y1)
    q1 = cvi.get_posterior(first.state)["f"]
    traced = []
    build = fit_module._checked_posterior_of
    for module in (fit_module, cvi_module):  # wherever a builder is traced from
        monkeypatch.setattr(
            module, "_checked_posterior_of", lambda *a: traced.append(1) or build(*a), raising=False
        )
    second = cvi.run(jax.random.PRNGKey(0), 100, X2, y=y2)
    q2 = cvi.get_posterior(second.state)["f"]
    q1_again = cvi.get_posterior(first.state)["f"]
    assert traced == []
    monkeypatch.undo()
    np.testing.assert_array_equal(q1_again.covariance_matrix, q1.covariance_matrix)
    fresh = autocvi.fit(gp_classifier, {"X": X2, "y": y2}, progress_bar=False).posterior["f"]
    np.testing.assert_allclose(q2.mean, fresh.mean, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(q2.covariance_matrix, fresh.covariance_matrix, rtol=1e-6, atol=1e-9)


def missing_response_regression(X, y=None, observed=None):
    """Missing responses as users impute them: ``obs_mask`` (NumPyro adds the latent
    ``y_unobserved`` for the masked entries)."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ w, 0.5), obs=y, obs_mask=observed)


def test_a_new_missing_data_mask_is_an_input_too(monkeypatch):
    """The mask of ``obs_mask`` is read by the imputed site's prior, but that site is a
    leaf (drawn from the model, not fitted): new data with other entries missing neither
    retrace, re-plan nor compile, and q(w) is the closed-form posterior of the rows each
    data set observes."""

    def data(seed):
        r = np.random.RandomState(seed)
        X = r.randn(40, 3)
        y = X @ r.randn(3) + 0.5 * r.randn(40)
        observed = np.ones(40, bool)
        observed[r.choice(40, 10, replace=False)] = False
        return X, np.where(observed, y, 0.0), observed

    def exact(X, y, observed):  # Bayesian linear regression on the observed rows
        Xo, yo = X[observed], y[observed]
        cov = np.linalg.inv(np.eye(3) + Xo.T @ Xo / 0.25)
        return cov @ Xo.T @ yo / 0.25, cov

    cvi = autocvi.CVI(missing_response_regression)
    first = cvi.run(jax.random.PRNGKey(0), 100, *data(0))
    traces, plans = count_traces(monkeypatch), count_plans(monkeypatch)
    compiled = autocvi.program_cache_info()["misses"]
    second = cvi.run(jax.random.PRNGKey(0), 100, *data(1))
    assert traces == [] and plans == [] and second.state.plan == first.state.plan
    assert autocvi.program_cache_info()["misses"] == compiled
    monkeypatch.undo()
    for run, seed in [(first, 0), (second, 1)]:
        mean, cov = exact(*data(seed))
        q = cvi.get_posterior(run.state)["w"]
        np.testing.assert_allclose(q.mean, mean, atol=1e-4 * np.sqrt(np.diag(cov)).min())
        np.testing.assert_allclose(q.covariance_matrix, cov, rtol=1e-4)


def indexed_walk(idx, y=None):
    """Counts on a random walk read through an index array (``f[idx]``): ``idx = arange``
    is the Markov block's structure (each count reads its own state), a permutation is
    not, so CVI plans again for it (``CVI._replan``)."""
    f = numpyro.sample("f", dist.GaussianRandomWalk(0.5, num_steps=12))
    with numpyro.plate("n", 12):
        numpyro.sample("y", dist.Poisson(jnp.exp(f[idx])), obs=y)


def test_new_data_that_break_a_blocks_structure_plan_again(monkeypatch):
    """With ``idx = arange`` each count reads its own state (the Markov solver's
    structure); a permuted ``idx`` does not, which the compiled read of the new data
    detects: CVI plans again for those data (from the cached trace) and fits them as a
    fresh ``autocvi.fit`` does."""
    y = np.random.RandomState(0).poisson(3.0, size=12).astype(float)
    idx1, idx2 = np.arange(12), np.random.RandomState(1).permutation(12)
    cvi = autocvi.CVI(indexed_walk)
    first = cvi.run(jax.random.PRNGKey(0), 200, idx1, y=y)
    assert cvi.get_schedule(first.state).blocks["f"].solver == "markov"
    traces, plans = count_traces(monkeypatch), count_plans(monkeypatch)
    second = cvi.run(jax.random.PRNGKey(0), 200, idx2, y=y)
    assert traces == [] and plans == [1] and second.state.plan != first.state.plan
    block = cvi.get_schedule(second.state).blocks.get("f")
    assert block is None or block.solver != "markov"  # here: dense natural parameters
    monkeypatch.undo()
    fresh = autocvi.fit(indexed_walk, {"idx": idx2, "y": y}, progress_bar=False)
    q, q_fresh = cvi.get_posterior(second.state)["f"], fresh.posterior["f"]
    np.testing.assert_allclose(q.mean, q_fresh.mean, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(q.variance, q_fresh.variance, rtol=1e-5)
    # a state of the first plan continues on the new one (the block's q becomes the dense
    # node's natural parameters) and reaches the same posterior
    resumed = cvi.run(None, 200, idx2, y=y, init_state=first.state)
    assert resumed.state.plan == second.state.plan
    q = cvi.get_posterior(resumed.state)["f"]
    sd = np.sqrt(q_fresh.variance)  # the same fixed point, to the stopping rule's tolerance
    assert np.all(np.abs(q.mean - q_fresh.mean) <= 0.01 * sd)
    np.testing.assert_allclose(q.variance, q_fresh.variance, rtol=0.01)


def test_a_matrix_valued_member_has_a_mean_and_variance():
    """A matrix-valued site in a joint group (multi-output regression ``W`` of shape
    (D, K) with a separate intercept) is a reshaped Gaussian: ``q.mean`` and
    ``q.variance`` have the site's shape and equal the closed form (each output's
    Bayesian linear regression on ``[X, 1]``, unit priors, known noise)."""
    rng = np.random.default_rng(0)
    n, d, k, noise = 60, 3, 2, 0.5
    X = rng.normal(size=(n, d))
    Y = X @ rng.normal(size=(d, k)) + noise * rng.normal(size=(n, k))

    def model(X, Y=None):
        W = numpyro.sample("W", dist.Normal(0.0, 1.0).expand([d, k]).to_event(2))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([k]).to_event(1))
        with numpyro.plate("n", n):
            numpyro.sample("Y", dist.Normal(X @ W + b, noise).to_event(1), obs=Y)

    r = autocvi.fit(model, {"X": jnp.asarray(X), "Y": jnp.asarray(Y)}, progress_bar=False)
    assert any("W" in g.member_names for g in r.schedule.joint)
    A = np.concatenate([X, np.ones((n, 1))], 1)
    cov = np.linalg.inv(np.eye(d + 1) + A.T @ A / noise**2)
    mean = cov @ A.T @ Y / noise**2  # (d + 1, k)
    q = r.posterior["W"]
    assert q.mean.shape == q.variance.shape == (d, k)
    np.testing.assert_allclose(q.mean, mean[:d], atol=2e-3)
    np.testing.assert_allclose(q.variance, np.repeat(np.diag(cov)[:d, None], k, 1), rtol=2e-3)


def test_fit_samples_include_deterministic_sites_as_mcmc_does():
    """``FitResult.sample`` returns ``numpyro.deterministic`` sites (MCMC.get_samples
    does): the zoo's non-centred eight schools, where each draw of theta is
    mu + tau * theta_raw of the same draw, exactly; the dict goes to ``Predictive``;
    ``deterministic=False`` leaves them out."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from zoo.models import MODELS

    model, data = MODELS["eight_schools"]()
    result = autocvi.fit(model, data, progress_bar=False, check=False)
    draws = result.sample(jax.random.PRNGKey(0), 500)
    assert set(draws) == {"mu", "tau", "theta_raw", "theta"}
    expected = draws["mu"][:, None] + draws["tau"][:, None] * draws["theta_raw"]
    np.testing.assert_allclose(draws["theta"], expected, rtol=1e-5, atol=1e-5)
    latents = set(result.sample(jax.random.PRNGKey(0), 5, deterministic=False))
    assert latents == {"mu", "tau", "theta_raw"}
    predicted = Predictive(model, posterior_samples=draws)(jax.random.PRNGKey(1), data["sigma"])
    assert predicted["y"].shape == (500, 8)
    assert "theta[0]" in result.summary()


def test_samples_of_a_subsampled_model_hold_its_latents_only():
    """A deterministic site of a subsampled plate exists per minibatch: ``sample`` returns
    the latents (every element of the local one) instead of failing on the shapes."""
    x = jnp.linspace(-1.0, 1.0, 400)
    y = 1.0 + 2.0 * x + jnp.sin(7.0 * x)

    def model(x, y=None):
        a = numpyro.sample("a", dist.Normal(0.0, 5.0))
        b = numpyro.sample("b", dist.Normal(0.0, 5.0))
        with numpyro.plate("n", x.shape[0], subsample_size=100) as idx:
            u = numpyro.sample("u", dist.Normal(0.0, 1.0))
            mean = numpyro.deterministic("mean", a + b * x[idx] + 0.1 * u)
            numpyro.sample("y", dist.Normal(mean, 1.0), obs=y[idx])

    result = autocvi.fit(model, {"x": x, "y": y}, num_steps=20, progress_bar=False, check=False)
    draws = result.sample(jax.random.PRNGKey(0), 10)
    assert {k: v.shape for k, v in draws.items()} == {"a": (10,), "b": (10,), "u": (10, 400)}
