"""Posteriors float32 (what users get by default) holds only with care.

* Narrow against its mean: the posterior of a Poisson GLM's intercept from 2,000 counts
  near 400 is 6 +- 0.001, a variance below the rounding of ``E[x^2] = 36 + 1e-6``, so
  everything that read the variance as ``E[x^2] - E[x]^2`` saw 0 or less: the line
  search called such a q collapsed and refused its steps, the diagnostics warned of a
  collapse, the stopping rule saw q move 1e9 sd per chunk and never stopped. The
  natural parameters hold it (the site-memory fit that showed it is in
  ``test_site_memory``).
* Large terms that cancel: a Gaussian block's KL as ``E_q[log sites] - log Z``; the
  moment nodes of a hierarchy's group means near 1,500 with sds near 0.3, built from
  ``E[x x^T] - m m^T`` (every update refused, the ELBO -inf from the first iteration).
* Far from the reference point: an exact message whose only latent is the node is
  computed once, and it was computed at a reference q near 0; for data near 30,000 its
  second-order part is the difference of two gradients of 300 that differ by 0.02, and
  a Normal mean's posterior came out 1.65 sd off (sigma = 100, 100 points).
* Badly scaled: a precision with entries from 1 to 1e11 (income in dollars), which is
  positive definite at unit diagonal but not to an eigenvalue check in float32.

Oracles: the q's own construction (its exact moments), float64 Newton/Laplace
posteriors, statsmodels' maximum likelihood, a textbook VMP fixed point in float64.
"""

import warnings

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import autocvi
from autocvi.engine.step import collapsed
from autocvi.families import FAMILIES, gaussian_mean_variance, gaussian_moments
from autocvi.infer.convergence import FitWarning


def _narrow_gaussian(q_family):
    """Natural parameters (float32) of a q whose sds are 1e-4 to 1e-3 of its means, as
    the posterior of an intercept from 2,000 counts near 400 is, with its exact moments."""
    mean = np.array([6.0, -3.0, 2.0])
    sd = np.array([1e-3, 2e-4, 7e-4])
    if q_family == "Normal":
        var = sd**2
        lam = (mean / var, -0.5 / var)
        return tuple(jnp.asarray(x, jnp.float32) for x in lam), mean, var
    corr = np.array([[1.0, 0.3, -0.2], [0.3, 1.0, 0.1], [-0.2, 0.1, 1.0]])
    cov = corr * np.outer(sd, sd)
    prec = np.linalg.inv(cov)
    lam = (prec @ mean, -0.5 * prec)
    return tuple(jnp.asarray(x, jnp.float32) for x in lam), mean, np.diag(cov)


def test_full_covariance_of_a_narrow_q_is_read_from_its_natural_parameters():
    """The covariance the Gauss-Hermite messages use: symmetric, and equal to the exact
    one (float64 numpy) to float32's accuracy relative to each entry's scale."""
    lam, mean, var = _narrow_gaussian("MultivariateNormal")
    m, cov = gaussian_moments(lam, "MultivariateNormal")
    np.testing.assert_allclose(np.asarray(m), mean, rtol=1e-6)
    cov = np.asarray(cov, np.float64)
    np.testing.assert_array_equal(cov, cov.T)
    exact = np.linalg.inv(-2.0 * np.asarray(lam[1], np.float64))
    scale = np.sqrt(np.outer(var, var))
    np.testing.assert_allclose(cov / scale, exact / scale, atol=1e-3)


@pytest.mark.parametrize("q_family", ["Normal", "MultivariateNormal"])
def test_gaussian_moments_of_a_narrow_q_are_read_from_its_natural_parameters(q_family):
    """In float32, E[x^2] - E[x]^2 of such a q cancels to 0 (36 + 1e-6 rounds to 36);
    the natural parameters hold it: mean and variance to float32's accuracy."""
    lam, mean, var = _narrow_gaussian(q_family)
    m, v = gaussian_mean_variance(lam, q_family)
    assert m.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(m), mean, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(v), var, rtol=1e-3)
    m_np, v_np = gaussian_mean_variance(tuple(np.asarray(x) for x in lam), q_family, xp=np)
    np.testing.assert_allclose(v_np, var, rtol=1e-3)
    # the route through the mean parameters loses the variance of the first coordinate
    first, second = FAMILIES[q_family].natural_to_mean(lam)
    if q_family == "MultivariateNormal":
        second = jnp.diagonal(second)
    assert abs(float(second[0] - first[0] ** 2) - var[0]) > 0.5 * var[0]


@pytest.mark.parametrize("q_family", ["Normal", "MultivariateNormal"])
def test_a_narrow_q_is_not_collapsed_and_a_degenerate_one_is(q_family):
    lam, _, _ = _narrow_gaussian(q_family)
    assert not bool(collapsed(lam, q_family))
    assert not bool(collapsed(tuple(np.asarray(x) for x in lam), q_family, xp=np))
    scale = jnp.float32(1e24)  # the variances down by 1e24: sds ~1e-15 of the means
    degenerate = (lam[0] * scale, lam[1] * scale)
    assert bool(collapsed(degenerate, q_family))


def _group_intercepts_precision():
    """A Poisson GLM's posterior precision over (b0, w, u): 3,000 counts near 1,100 in
    10 groups, so ~3e5 along each ``b0 + u_g`` and ~10 across (float64), with its mean
    and the predictors' rows."""
    rng = np.random.default_rng(0)
    g = rng.integers(0, 10, 3000)
    X = rng.normal(size=(3000, 2))
    A = np.column_stack([np.ones(3000), X, np.eye(10)[g]])
    rate = np.exp(7.0 + 0.3 * rng.normal(size=10)[g] + X @ [0.1, -0.05])
    precision = A.T @ (A * rate[:, None]) + np.diag([1e-2, 1.0, 1.0] + [11.0] * 10)
    mean = np.r_[7.0, 0.1, -0.05, 0.3 * rng.normal(size=10)]
    return precision, mean, A


@pytest.mark.parametrize("xp", [jnp, np], ids=["jax", "numpy"])
def test_the_predictors_of_an_ill_conditioned_q_are_read_from_its_natural_parameters(xp):
    """Float32 natural parameters ``(P m, -P/2)`` of that q: each predictor's mean and
    variance against float64 numpy on the same (rounded) parameters. ``inv(P) @ P m``
    put the predictors' means 19 sd off (the inverse's rounding times entries of 2e7),
    and the fit's line search refused every step as a loss."""
    precision, mean, A = _group_intercepts_precision()
    lam = (np.float32(precision @ mean), np.float32(-0.5 * precision))
    exact_precision = -2.0 * np.float64(lam[1])
    exact_cov = np.linalg.inv(exact_precision)
    exact_mean = np.linalg.solve(exact_precision, np.float64(lam[0]))
    m, cov = gaussian_moments(tuple(xp.asarray(x) for x in lam), "MultivariateNormal", xp)
    assert m.dtype == cov.dtype == np.float32
    m, cov = np.float64(m), np.float64(cov)
    np.testing.assert_array_equal(cov, cov.T)
    variance = np.einsum("ni,ij,nj->n", A, exact_cov, A)  # 2e-6 to 9e-6
    assert np.max(np.abs(A @ (m - exact_mean)) / np.sqrt(variance)) < 0.01
    assert np.max(np.abs(np.einsum("ni,ij,nj->n", A, cov, A) / variance - 1)) < 0.01


def test_gradient_trainings_mean_of_an_ill_conditioned_q_is_read_exactly():
    """``optimizer=`` fits start from q's mean and Cholesky factor
    (``gradient_training.scale_of``): it read the mean as ``inv(P) @ P m`` too, 19 sd
    off along the predictors of the q above."""
    from autocvi.infer.gradient_training import scale_of

    precision, mean, A = _group_intercepts_precision()
    lam = (jnp.asarray(np.float32(precision @ mean)), jnp.asarray(np.float32(-0.5 * precision)))
    exact_precision = -2.0 * np.float64(lam[1])
    exact_mean = np.linalg.solve(exact_precision, np.float64(lam[0]))
    sd = np.sqrt(np.einsum("ni,ij,nj->n", A, np.linalg.inv(exact_precision), A))
    m, _ = scale_of("MultivariateNormal", lam)
    assert np.max(np.abs(A @ (np.float64(m) - exact_mean)) / sd) < 0.01


def test_a_negative_binomial_glm_of_large_counts_fits_in_float32():
    """The same counts with a dispersion (a joint Gaussian over b0, w and log phi, Monte
    Carlo messages, line-searched): every step was refused as collapsed and the fit
    stopped 10 sd off, warning. Oracle: statsmodels' NB2 maximum likelihood (2,000
    points, N(0, 1) and HalfNormal(10) priors: the posterior mean is the MLE to a few
    hundredths of its standard errors)."""
    from statsmodels.discrete.discrete_model import NegativeBinomial

    rng = np.random.default_rng(1)
    X = 0.5 * rng.normal(size=(2000, 4))
    mu = np.exp(6.0 + X @ np.array([0.5, -0.3, 0.2, 0.0]))
    y = rng.negative_binomial(20, 20 / (20 + mu)).astype(float)
    mle = NegativeBinomial(y, np.column_stack([np.ones(len(y)), X]), loglike_method="nb2").fit(
        disp=0, maxiter=500
    )
    coef, se = np.asarray(mle.params[:5]), np.asarray(mle.bse[:5])

    def model(X, y=None):
        b0 = numpyro.sample("b0", dist.Normal(0, 1))
        with numpyro.plate("features", X.shape[1]):
            w = numpyro.sample("w", dist.Normal(0, 1))
        phi = numpyro.sample("phi", dist.HalfNormal(10.0))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(b0 + X @ w), phi), obs=y)

    with warnings.catch_warnings():
        warnings.simplefilter("error", FitWarning)
        result = autocvi.fit(model, {"X": jnp.asarray(X), "y": jnp.asarray(y)})
    assert result.converged
    post = result.posterior
    mean = np.r_[float(post["b0"].mean), np.asarray(post["w"].mean)]
    sd = np.sqrt(np.r_[float(post["b0"].variance), np.asarray(post["w"].variance)])
    assert np.max(np.abs(mean - coef) / se) < 0.3
    assert np.all(np.abs(sd / se - 1) < 0.15)
    # statsmodels' alpha is 1 / phi; phi's posterior sd is about 3% of it here
    assert float(post["phi"].mean) == pytest.approx(1.0 / float(mle.params[5]), rel=0.03)


def _poisson_laplace(X, y, prior_sd):
    """The Poisson GLM's posterior mode and Laplace sds in float64 (Newton): with counts
    near 12,000 the Gaussian VI optimum is it to a few thousandths of an sd."""
    A = np.column_stack([np.ones(len(y)), X])
    prior_precision = np.diag(1.0 / np.asarray(prior_sd) ** 2)
    theta = np.zeros(A.shape[1])
    theta[0] = np.log(y.mean())
    for _ in range(50):
        rate = np.exp(A @ theta)
        H = A.T @ (A * rate[:, None]) + prior_precision
        theta = theta + np.linalg.solve(H, A.T @ (y - rate) - prior_precision @ theta)
    return theta, np.sqrt(np.diag(np.linalg.inv(H)))


@pytest.mark.parametrize("log_rate,blocks", [(9.4, True), (10.5, True), (8.0, False), (9.4, False)])
def test_a_poisson_glm_of_counts_in_the_thousands_reaches_its_posterior_in_float32(
    log_rate, blocks
):
    """As a Gaussian block (weight-space sites), its ELBO's KL was E_q[log sites] - log Z,
    two sums of size 3e8 that float32 rounds to tens of nats: the line search refused
    the last steps as losses and the fit stopped 1.2 sd off, saying converged, with no
    warning, the same on every rng key (log rate 9.4; 0.8 sd at 10.5). The KL is now
    read from the solver's factors. As a joint Gaussian node (``gaussian_blocks=False``)
    its Gauss-Hermite message read the predictor's variance from E[x x^T] - m m^T, which
    cancelled to a negative number, was clipped to 0 and took the message's precision
    with it: q stopped 770 sd off after 4 steps, saying converged, no warning."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 2))
    y = rng.poisson(np.exp(log_rate + X @ np.array([0.1, -0.05]))).astype(float)
    mode, sd = _poisson_laplace(X, y, [10.0, 1.0, 1.0])

    def model(X, y=None):
        b0 = numpyro.sample("b0", dist.Normal(0, 10))
        with numpyro.plate("features", X.shape[1]):
            w = numpyro.sample("w", dist.Normal(0, 1))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Poisson(jnp.exp(b0 + X @ w)), obs=y)

    result = autocvi.fit(model, {"X": jnp.asarray(X), "y": jnp.asarray(y)}, gaussian_blocks=blocks)
    assert bool(result.schedule.blocks) == blocks and result.converged
    post = result.posterior
    mean = np.r_[float(post["b0"].mean), np.asarray(post["w"].mean)]
    q_sd = np.sqrt(np.r_[float(post["b0"].variance), np.asarray(post["w"].variance)])
    assert np.max(np.abs(mean - mode) / sd) < 0.1
    assert np.all(np.abs(q_sd / sd - 1) < 0.1)


def test_a_logistic_regression_on_income_in_dollars_reports_its_posterior():
    """Age and income in dollars, uncentred: the Gaussian block fits, but its posterior's
    precision (entries from 1 to 1e11) failed NumPyro's positive-definiteness check in
    float32 and ``fit`` raised a raw "invalid precision_matrix parameter" ValueError.
    Oracle: statsmodels' logistic MLE and standard errors (500 points, the priors'
    pull is below 0.01 sd)."""
    import statsmodels.api as sm

    rng = np.random.default_rng(0)
    age, income = rng.uniform(20, 80, 500), rng.normal(50000, 15000, 500)
    logit = -3 + 0.05 * age + 0.00002 * income
    y = (rng.uniform(size=500) < 1 / (1 + np.exp(-logit))).astype(float)
    X = np.column_stack([age, income])
    mle = sm.Logit(y, sm.add_constant(X)).fit(disp=0)

    def model(X, y=None):
        b0 = numpyro.sample("b0", dist.Normal(0, 10))
        with numpyro.plate("features", X.shape[1]):
            w = numpyro.sample("w", dist.Normal(0, 1))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=b0 + X @ w), obs=y)

    result = autocvi.fit(model, {"X": jnp.asarray(X), "y": jnp.asarray(y)})
    assert result.schedule.blocks and result.converged
    post = result.posterior
    mean = np.r_[float(post["b0"].mean), np.asarray(post["w"].mean)]
    sd = np.sqrt(np.r_[float(post["b0"].variance), np.asarray(post["w"].variance)])
    se = np.asarray(mle.bse)
    assert np.max(np.abs(mean - np.asarray(mle.params)) / se) < 0.2
    assert np.all(np.abs(sd / se - 1) < 0.1)


def _covariate_imputation():
    """NumPyro's own missing-data idiom on a covariate that a likelihood reads: ``x`` with
    ``obs_mask`` (20% missing), ``y`` regressed on it."""

    def model(x, y):
        mx = numpyro.sample("mx", dist.Normal(0, 5))
        sx = numpyro.sample("sx", dist.HalfNormal(2))
        with numpyro.plate("N", x.shape[0]):
            xi = numpyro.sample("x", dist.Normal(mx, sx), obs=x, obs_mask=~jnp.isnan(x))
            numpyro.sample("y", dist.Normal(1.0 + 2.0 * xi, 0.5), obs=y)

    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    y = 1 + 2 * x + 0.5 * rng.normal(size=50)
    x[rng.uniform(size=50) < 0.2] = np.nan
    return model, {"x": jnp.asarray(x, jnp.float32), "y": jnp.asarray(y, jnp.float32)}


def _explicit_imputation():
    """The same posterior over (mx, sx, the missing x) with the missing values as an
    explicit latent: NUTS on ``obs_mask``'s version diverges on every draw (its latent
    also has the observed positions, which no density reads: flat directions)."""
    _, data = _covariate_imputation()
    x, y = np.asarray(data["x"]), data["y"]
    missing = np.flatnonzero(np.isnan(x))

    def model(x, y):
        mx = numpyro.sample("mx", dist.Normal(0, 5))
        sx = numpyro.sample("sx", dist.HalfNormal(2))
        with numpyro.plate("M", len(missing)):
            x_missing = numpyro.sample("x_missing", dist.Normal(mx, sx))
        with numpyro.plate("O", x.shape[0] - len(missing)):
            numpyro.sample("x_observed", dist.Normal(mx, sx), obs=jnp.delete(x, missing))
        xi = x.at[missing].set(x_missing)
        with numpyro.plate("N", x.shape[0]):
            numpyro.sample("y", dist.Normal(1.0 + 2.0 * xi, 0.5), obs=y)

    return model, {"x": jnp.asarray(np.nan_to_num(x)), "y": y}


def _nuts_covariate_imputation():  # pragma: no cover - regenerates COVARIATE_IMPUTATION_NUTS
    """NUTS's means and sds of mx, sx and the missing x (:func:`nuts_reference.nuts_samples`)."""
    from nuts_reference import nuts_samples

    s = nuts_samples(_explicit_imputation)
    draws = np.column_stack([s["mx"], s["sx"], s["x_missing"]])
    return [round(float(v), 4) for v in draws.mean(0)], [round(float(v), 4) for v in draws.std(0)]


COVARIATE_IMPUTATION_NUTS = (
    [0.125, 0.9467, 1.3256, -1.3277, -0.226, -0.7315, 0.0203, -0.8394, 1.7923, 0.3152, 1.3786],
    [0.1327, 0.0983, 0.2436, 0.2438, 0.2399, 0.2461, 0.2418, 0.2387, 0.2439, 0.2427, 0.2406],
)


@pytest.mark.slow  # CI runs it; the default run stays under 10 minutes
def test_a_covariate_imputed_with_obs_mask_matches_nuts():
    """``x_unobserved`` has every position, and those ``obs_mask`` marks observed have no
    density: q's precision there is near 0 while the rest is near 100, which NumPyro's
    eigenvalue check rejected in float32 ("too ill-conditioned ... an uncentred
    predictor"). At unit diagonal it is a posterior like any other."""
    model, data = _covariate_imputation()
    result = autocvi.fit(model, data)
    assert result.converged
    post = result.posterior
    missing = np.isnan(np.asarray(data["x"]))
    mean = np.r_[float(post["mx"].mean), float(post["sx"].mean)]
    mean = np.r_[mean, np.asarray(post["x_unobserved"].mean)[missing]]
    var = np.r_[float(post["mx"].variance), float(post["sx"].variance)]
    var = np.r_[var, np.asarray(post["x_unobserved"].variance)[missing]]
    ref_mean, ref_sd = (np.asarray(v) for v in COVARIATE_IMPUTATION_NUTS)
    assert np.max(np.abs(mean - ref_mean) / ref_sd) < 0.15
    assert np.all(np.abs(np.sqrt(var) / ref_sd - 1) < 0.1)


# The BUGS "dyes" data (Box and Tiao 1973): yields of 6 batches, 5 samples each.
_DYES = np.array(
    [
        [1545, 1440, 1440, 1520, 1580],
        [1540, 1555, 1490, 1560, 1495],
        [1595, 1550, 1605, 1510, 1560],
        [1445, 1440, 1595, 1465, 1545],
        [1595, 1630, 1515, 1635, 1625],
        [1520, 1455, 1450, 1480, 1445],
    ],
    float,
)


def _dyes_vmp_fixed_point(y, a, mu_sd, iterations=2000):
    """Coordinate ascent (Winn and Bishop's VMP) in float64 for q(mu, theta) q(tau_w)
    q(tau_b): a joint Gaussian over the overall and group means, Gamma precisions."""
    B, S = y.shape
    e_tw, e_tb = 1.0, 1.0
    for _ in range(iterations):
        P = np.zeros((B + 1, B + 1))
        h = np.zeros(B + 1)
        P[0, 0] = 1.0 / mu_sd**2 + B * e_tb
        P[0, 1:] = P[1:, 0] = -e_tb
        P[1:, 1:] = np.eye(B) * (e_tb + S * e_tw)
        h[1:] = e_tw * y.sum(1)
        cov = np.linalg.inv(P)
        m = cov @ h
        v = np.diag(cov)
        ss_w = np.sum((y - m[1:, None]) ** 2) + S * np.sum(v[1:])
        ss_b = np.sum((m[1:] - m[0]) ** 2 + v[1:] + v[0] - 2.0 * cov[0, 1:])
        tw = (a + B * S / 2, a + ss_w / 2)
        tb = (a + B / 2, a + ss_b / 2)
        e_tw, e_tb = tw[0] / tw[1], tb[0] / tb[1]
    return m, e_tw, e_tb


def test_a_conjugate_hierarchy_of_measurements_far_from_zero_reaches_the_vmp_fixed_point():
    """The BUGS dyes model as written there (vague Gamma(0.001, 0.001) precisions, a flat
    Normal on the overall mean), in float32: the group means' q has sds near 8 around
    means near 1,500. Its moment nodes from the mean parameters had no variance left, the
    ELBO was -inf from the first iteration and q never moved; from the natural
    parameters autocvi reaches the textbook VMP fixed point (float64) to float32's
    accuracy."""

    def model(y):
        B, S = y.shape
        mu = numpyro.sample("mu", dist.Normal(0.0, 1e5))
        tau_w = numpyro.sample("tau_w", dist.Gamma(1e-3, 1e-3))
        tau_b = numpyro.sample("tau_b", dist.Gamma(1e-3, 1e-3))
        with numpyro.plate("batch", B, dim=-2):
            theta = numpyro.sample("theta", dist.Normal(mu, 1 / jnp.sqrt(tau_b)))
            with numpyro.plate("sample", S, dim=-1):
                numpyro.sample("y", dist.Normal(theta, 1 / jnp.sqrt(tau_w)), obs=y)

    m, e_tw, e_tb = _dyes_vmp_fixed_point(_DYES, 1e-3, 1e5)
    result = autocvi.fit(model, {"y": _DYES}, progress_bar=False, check=False)
    assert result.converged and np.isfinite(result.elbo_final)
    assert result.diagnostics.refused == {}
    np.testing.assert_allclose(float(result.posterior["tau_w"].mean), e_tw, rtol=2e-3)
    np.testing.assert_allclose(float(result.posterior["tau_b"].mean), e_tb, rtol=2e-3)
    np.testing.assert_allclose(np.ravel(result.posterior["theta"].mean), m[1:], atol=0.05)
    np.testing.assert_allclose(float(result.posterior["mu"].mean), m[0], atol=0.05)


@pytest.mark.parametrize("sigma", [1.0, 10.0, 100.0, 1000.0])
def test_a_normal_mean_of_measurements_near_30000_is_the_closed_form(sigma):
    """Known sigma, Normal(0, 1e5) prior: the posterior is Normal in closed form. Before,
    sigma = 100 gave a mean 1.65 posterior sd off (the constant message's precision 5.5e-4
    off), silently."""
    rng = np.random.default_rng(0)
    y32 = (3e4 + sigma * rng.normal(size=100)).astype(np.float32)
    y = y32.astype(np.float64)

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1e5))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, sigma), obs=y)

    precision = 1e-10 + y.size / sigma**2
    mean, sd = y.sum() / sigma**2 / precision, precision**-0.5
    result = autocvi.fit(model, {"y": jnp.asarray(y32)}, progress_bar=False)
    post = result.posterior["mu"]
    assert result.converged
    assert abs(float(post.mean) - mean) / sd < 0.05
    assert float(np.sqrt(post.variance)) / sd == pytest.approx(1.0, abs=1e-3)


def test_a_regression_on_a_response_near_30000_is_the_closed_form():
    """The joint Gaussian q(a, b) of an intercept and a slope with known noise: the same
    constant-message cancellation, in the full-covariance path. Oracle: the Gaussian
    posterior in closed form (float64 linear algebra)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=100)
    y32 = (3e4 + 5.0 * x + 100.0 * rng.normal(size=100)).astype(np.float32)
    x32 = x.astype(np.float32)

    def model(x, y):
        a = numpyro.sample("a", dist.Normal(0.0, 1e5))
        b = numpyro.sample("b", dist.Normal(0.0, 100.0))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Normal(a + b * x, 100.0), obs=y)

    A = np.column_stack([np.ones(100), x32.astype(float)])
    P = np.diag([1e-10, 1e-4]) + A.T @ A / 100.0**2
    cov = np.linalg.inv(P)
    mean = cov @ (A.T @ y32.astype(float)) / 100.0**2
    result = autocvi.fit(model, {"x": jnp.asarray(x32), "y": jnp.asarray(y32)}, progress_bar=False)
    post = result.posterior
    got = np.array([float(post["a"].mean), float(post["b"].mean)])
    sd = np.sqrt(np.diag(cov))
    assert result.converged
    assert np.max(np.abs(got - mean) / sd) < 0.05
    got_sd = np.sqrt([float(post["a"].variance), float(post["b"].variance)])
    np.testing.assert_allclose(got_sd / sd, 1.0, atol=2e-3)


def test_the_simplex_map_is_numpyros_and_stays_finite_where_float32_rounds_a_weight_to_0():
    """``LogSpaceStickBreaking`` is NumPyro's stick-breaking map (oracle: NumPyro's own
    forward map, inverse and log-Jacobian, and the log-determinant of the map's numerical
    Jacobian), computed from ``log w``: where a weight is below float32's range NumPyro's
    gives an exact 0 and a log-Jacobian of -inf, the log-space map a finite one."""
    import jax
    from numpyro.distributions.transforms import StickBreakingTransform, biject_to

    from autocvi.analysis.bijections import LogSpaceStickBreaking, unconstraining_map

    assert isinstance(
        unconstraining_map(dist.Dirichlet(jnp.ones(4)).support), LogSpaceStickBreaking
    )
    assert type(unconstraining_map(dist.Gamma(1.0).support)) is type(
        biject_to(dist.Gamma(1.0).support)
    )
    ours, numpyros = LogSpaceStickBreaking(), StickBreakingTransform()
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(0).normal(0.0, 3.0, (5, 3)))
        y = ours(x)
        np.testing.assert_allclose(y, numpyros(x), rtol=1e-12)
        np.testing.assert_allclose(ours.inv(y), x, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(
            ours.log_abs_det_jacobian(x, y), numpyros.log_abs_det_jacobian(x, y), rtol=1e-12
        )
        jac = jax.jacfwd(lambda u: ours(u)[:-1])(x[0])
        assert np.isclose(
            np.linalg.slogdet(np.asarray(jac))[1], ours.log_abs_det_jacobian(x[0], y[0])
        )
    far = jnp.asarray([0.0, -120.0, 25.0], jnp.float32)  # weight 2 ~ e^-120, weight 4 ~ 1e-11
    assert not np.all(np.asarray(numpyros(far)) > 0)
    assert not np.isfinite(np.asarray(numpyros.log_abs_det_jacobian(far, numpyros(far))))
    y = ours(far)
    assert np.all(np.asarray(y) > 0) and np.isclose(float(jnp.sum(y)), 1.0, atol=1e-6)
    assert np.isfinite(np.asarray(ours.log_abs_det_jacobian(far, y)))
    assert np.isfinite(np.asarray(dist.Dirichlet(0.2 * jnp.ones(4)).log_prob(y)))


def test_prior_candidates_of_a_simplex_are_on_the_simplex():
    """The elementwise median of 15 ``Dirichlet(0.2)`` draws is not a point of the simplex
    (it sums to far less than 1): the model raised on it (``Categorical(probs=w)``) and
    ``prior_candidates`` returned no candidate at all. Per batch element it now takes the
    draw nearest that median."""
    from autocvi.model.trace import prior_candidates

    def model(y):
        w = numpyro.sample("w", dist.Dirichlet(0.2 * jnp.ones(3)))
        with numpyro.plate("groups", 2):
            p = numpyro.sample("p", dist.Dirichlet(jnp.ones(4)))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("y", dist.Categorical(probs=w), obs=y)
        return p

    candidates = prior_candidates(model, {"y": jnp.asarray([0, 2, 2, 0])})
    assert len(candidates) == 16
    for c in candidates:
        for name in ("w", "p"):
            v = np.asarray(c[name], np.float64)
            assert np.all(v >= 0) and np.allclose(v.sum(-1), 1.0, atol=1e-5), (name, v)
    assert np.asarray(candidates[0]["p"]).shape == (2, 4)


def test_a_mixture_with_a_sparse_dirichlet_and_an_empty_component_fits_in_float32():
    """``Dirichlet(0.2)`` weights, three components, the middle one with no data (a new
    user's overfitted mixture). In float32 q's start and draws rounded the empty weight to
    0 (prior and log-Jacobian infinite), and the condition test whitened the flat tail of
    its logit to sd 3,000: q never moved. Oracle: the two occupied components are 10
    sds apart, so the assignments are known and the weights' posterior is
    ``Dirichlet(0.2 + n_0, 0.2, 0.2 + n_2)``; its marginals of the occupied weights."""
    import sys
    from pathlib import Path

    import jax

    sys.path.insert(0, str(Path(__file__).parent))
    from zoo.models import empty_component_mixture

    model, data = empty_component_mixture(0.2)
    y = np.asarray(data["y"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = autocvi.fit(model, {"y": jnp.asarray(y, jnp.float32)}, progress_bar=False)
    assert result.converged and np.isfinite(result.elbo_final)
    assert not any("not finite" in str(w.message) for w in caught)
    draws = np.asarray(result.sample(jax.random.PRNGKey(0), 8000)["w"], np.float64)
    alpha = 0.2 + np.array([np.sum(y < -2.5), 0.0, np.sum(y > 2.5)])
    total = alpha.sum()
    mean = alpha / total
    sd = np.sqrt(alpha * (total - alpha) / (total**2 * (total + 1)))
    for k in (0, 2):
        assert abs(draws[:, k].mean() - mean[k]) < 0.2 * sd[k], k
        assert 0.8 < draws[:, k].std() / sd[k] < 1.25, k


def _gp_prior_model(X, y=None):
    """A GP classifier whose length-scale is learned: its prior is a constant exact message
    that every M-step recomputes (and differentiates)."""
    log_l = numpyro.param("log_lengthscale", 0.0)
    d2 = jnp.sum((X[:, None, :] - X[None, :, :]) ** 2, -1)
    K = jnp.exp(-0.5 * d2 / jnp.exp(2 * log_l)) + 1e-5 * jnp.eye(X.shape[0])
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(X.shape[0]), K))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def _second_evaluations(monkeypatch) -> list:
    """Which constant messages the init of :func:`_gp_prior_model` evaluates a second time."""
    import jax

    from autocvi.engine import step

    calls = []
    near = step._near_the_factor
    monkeypatch.setattr(
        step, "_near_the_factor", lambda lay, *a: calls.append(lay.q_family) or near(lay, *a)
    )
    algorithm = step.cvi(autocvi.plan(_gp_prior_model, _GP_DATA))
    jax.make_jaxpr(algorithm.init)(jax.random.PRNGKey(0))
    return calls


_GP_DATA = {
    "X": np.linspace(-2.0, 2.0, 24)[:, None],
    "y": (np.sin(3 * np.linspace(-2.0, 2.0, 24)) > 0).astype(np.float64),
}


def test_the_second_evaluation_of_a_constant_message_is_float32s(monkeypatch):
    """Float32: the constant exact message of a GP's prior is evaluated again near the
    factor (at the message's own Gaussian where its precision is well-conditioned)."""
    assert _second_evaluations(monkeypatch) == ["MultivariateNormal"]


@pytest.mark.float64
def test_float64_evaluates_a_constant_message_once(monkeypatch):
    """Float64 rounds 1e-16 of the message's scale at the reference point, so the second
    evaluation (an eigendecomposition and two inverses of a GP's prior precision, which every
    M-step of variational EM differentiated) is not made: ionosphere's GP EM fit took 13.7 s
    with it and 6.2 s without (``benchmarks/gp_hyperparameters.py``'s EM, one split)."""
    assert _second_evaluations(monkeypatch) == []
