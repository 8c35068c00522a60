"""The Pareto-k check of q (autocvi.infer.importance) against closed forms.

Oracles: samples of a generalised Pareto distribution with a known shape (scipy); the
tail of the importance ratios of N(0, 1) under q = N(0, s^2), whose shape is 1 - s^2 in
closed form; and models whose exact posterior q represents, where every importance
ratio equals the model's evidence, known in closed form.
"""

import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy import stats
from scipy.special import gammaln

import autocvi
from autocvi.infer.convergence import FitWarning
from autocvi.infer.guide import CVIGuide, joint_posteriors
from autocvi.infer.importance import (
    DEFENSIVE_SCALE,
    ESS_LIMIT,
    K_LIMIT,
    SPREAD_LIMIT,
    SPREAD_Z,
    SPREAD_Z_MIN,
    ImportanceCheck,
    Spread,
    effective_sample_fraction,
    log_importance_ratios,
    pareto_k,
    spread_of,
    spread_z_limit,
    widened,
)


@pytest.mark.parametrize("shape", [0.2, 0.5, 0.9, 1.3])
def test_pareto_k_recovers_a_generalised_pareto_shape(shape):
    # The tail of a GPD is a GPD with the same shape; 10,000 draws put ~300 in the tail.
    draws = stats.genpareto.rvs(shape, size=10_000, random_state=np.random.default_rng(1))
    assert pareto_k(np.log(draws)) == pytest.approx(shape, abs=0.12)


def test_pareto_k_of_light_tails_is_small():
    rng = np.random.default_rng(2)
    assert pareto_k(np.log(rng.uniform(size=4000))) < 0.1  # bounded: a negative shape
    assert pareto_k(np.log(rng.exponential(size=4000))) < 0.2  # exponential: shape 0
    assert pareto_k(np.zeros(1000)) == 0.0  # constant ratios: q is the posterior
    assert np.isnan(pareto_k(np.zeros(10)))  # too few ratios for a tail
    assert pareto_k(np.array([0.0] * 100 + [np.inf])) == np.inf


@pytest.mark.parametrize("sd", [0.5, 0.8])
def test_pareto_k_of_a_too_narrow_gaussian_q(sd):
    # Ratios N(x; 0, 1) / N(x; 0, sd^2) for x ~ q have a Pareto tail with shape 1 - sd^2.
    x = np.random.default_rng(3).normal(0.0, sd, size=8000)
    log_ratios = stats.norm.logpdf(x) - stats.norm.logpdf(x, 0.0, sd)
    assert pareto_k(log_ratios) == pytest.approx(1.0 - sd**2, abs=0.12)


@pytest.mark.parametrize("sd_p", [0.7, 1.0, 1.1, 1.5, 2.0])
def test_spread_of_finds_the_coordinate_q_is_too_narrow_at(sd_p):
    """q = N(0, I) over a (2, 2) site and a scalar; p has sd ``sd_p`` along coordinate
    ``x[1, 0]`` and is q elsewhere. The weighted sd there converges to ``sd_p`` (closed
    form), so q's sd over it is ``1 / sd_p``: flagged exactly where that is well below
    SPREAD_LIMIT (1.5, 2.0), not where q is as wide or wider (0.7, 1.0, 1.1)."""
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(8000, 2, 2)), rng.normal(size=8000)
    t = x[:, 1, 0]
    log_ratios = stats.norm.logpdf(t, 0.0, sd_p) - stats.norm.logpdf(t)
    spread = spread_of(log_ratios, {"x": x, "y": y})
    check = ImportanceCheck(0.5, 0.5, 8000, spread)
    if sd_p > 1.0:
        assert spread.coordinate == "x[1,0]"
    if 1.0 < sd_p <= 1.5:  # the weights' Pareto shape 1 - 1 / sd_p^2 is at most 0.56
        assert spread.ratio == pytest.approx(1.0 / sd_p, rel=0.1)
    if sd_p == 2.0:  # shape 0.75: weighting cannot recover all of p's tails, it understates
        assert 1.0 / sd_p < spread.ratio < SPREAD_LIMIT
    assert check.too_narrow == (sd_p >= 1.5)
    if not check.too_narrow:
        assert spread.ratio >= SPREAD_LIMIT or spread.z < spread.z_limit
    assert spread.z_limit == SPREAD_Z_MIN  # five coordinates


@pytest.mark.parametrize("sd_p", [1.0, 1.6, 2.0, 2.5])
def test_defensive_draws_recover_the_spread_q_never_draws(sd_p):
    """q = N(0, 1), p = N(0, sd_p^2) on one coordinate of three: q's own draws understate
    p's sd once the weights' tail is heavy (shape 1 - 1 / sd_p^2 > 0.5 from sd_p 1.5).
    With as many draws again from q_s = N(0, DEFENSIVE_SCALE^2) weighted by p over the
    balance-heuristic mixture g = (q + q_s) / 2, the ratio is the closed form 1 / sd_p;
    q's sd is that of its own draws. A q as wide as p reads 1 and is not flagged."""
    rng = np.random.default_rng(11)
    n = 8000
    from_q = np.arange(2 * n) < n
    scale = np.where(from_q, 1.0, DEFENSIVE_SCALE)[:, None]
    x = rng.normal(size=(2 * n, 3)) * scale
    t = x[:, 1]
    log_q = stats.norm.logpdf(x).sum(1)
    log_qs = stats.norm.logpdf(x, 0.0, DEFENSIVE_SCALE).sum(1)
    log_g = np.logaddexp(log_q, log_qs) - np.log(2.0)
    log_p = log_q - stats.norm.logpdf(t) + stats.norm.logpdf(t, 0.0, sd_p)
    spread = spread_of(log_p - log_g, {"x": x}, from_q)
    own = spread_of((log_p - log_q)[from_q], {"x": x[from_q]})
    if sd_p == 1.0:
        assert spread.ratio == pytest.approx(1.0, abs=0.05)
        assert not ImportanceCheck(0.5, 0.5, n, spread).too_narrow
        return
    assert spread.coordinate == "x[1]"
    assert spread.ratio == pytest.approx(1.0 / sd_p, rel=0.08)
    assert ImportanceCheck(0.5, 0.5, n, spread).too_narrow
    if sd_p >= 2.0:  # q's own draws understate the miss; the defensive ones do not
        assert own.ratio > spread.ratio + 0.05 and own.z < spread.z


def test_widened_q_keeps_the_mean_and_the_support():
    """q_s of a Gaussian, a transformed Gaussian (a log-normal scale) and a joint
    Gaussian: the same mean on the unconstrained scale, sds times the scale; conjugate
    families are not widened."""
    import numpyro.distributions as dist

    normal = widened(dist.Normal(1.0, 0.5), 2.0)
    assert (float(normal.loc), float(normal.scale)) == (1.0, 1.0)
    log_normal = widened(dist.LogNormal(0.3, 0.2), 2.0)
    assert float(log_normal.base_dist.scale) == pytest.approx(0.4)
    assert float(log_normal.log_prob(1.0)) == pytest.approx(
        stats.lognorm.logpdf(1.0, 0.4, scale=np.exp(0.3))
    )
    mvn = widened(dist.MultivariateNormal(np.zeros(2), np.array([[2.0, 0.5], [0.5, 1.0]])), 2.0)
    np.testing.assert_allclose(
        mvn.covariance_matrix, 4 * np.array([[2.0, 0.5], [0.5, 1.0]]), rtol=1e-6
    )
    assert widened(dist.Gamma(2.0, 1.0), 2.0) is None


def test_the_spread_z_limit_is_a_bonferroni_bound():
    """1% family-wise: Phi^-1(1 - 0.01 / d), clipped to [3, 4] (the zoo's calibration)."""
    assert spread_z_limit(1) == spread_z_limit(7) == SPREAD_Z_MIN == 3.0
    assert spread_z_limit(12) == pytest.approx(stats.norm.isf(0.01 / 12))
    assert spread_z_limit(100) == pytest.approx(3.719, abs=1e-3)
    assert spread_z_limit(10_000) == SPREAD_Z == 4.0


def test_a_narrow_coordinate_among_few_counts_at_three_standard_errors():
    """A spread at z 3.5 among two coordinates warns; among a thousand it does not."""
    few = ImportanceCheck(0.5, 0.5, 4000, Spread("mu", 0.79, 3.5, spread_z_limit(2)))
    many = ImportanceCheck(0.5, 0.5, 4000, Spread("u[3]", 0.79, 3.5, spread_z_limit(1000)))
    assert few.too_narrow and not many.too_narrow


def test_spread_of_exact_q_is_one_everywhere():
    """Constant ratios (q is the posterior): the weighted sds are q's own."""
    x = np.random.default_rng(6).normal(size=(1000, 3))
    spread = spread_of(np.full(1000, -2.0), {"x": x})
    assert spread.ratio == pytest.approx(1.0, abs=1e-9)
    assert not ImportanceCheck(0.0, 1.0, 1000, spread).too_narrow
    assert spread_of(np.zeros(1000), {}) is None


def _constant_ratio_fit(model, data):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FitWarning)
        result = autocvi.fit(model, data, progress_bar=False)
    guide = CVIGuide(
        result.posterior, joint=joint_posteriors(result.schedule, result.state.natural)
    )
    ratios = log_importance_ratios(
        model, data, {}, lambda _: guide, {}, jax.random.PRNGKey(0), 2000
    )
    return result, ratios


def test_ratios_are_the_evidence_when_q_is_exact_gamma_precision():
    """y_i ~ N(0, 1/tau), tau ~ Gamma(a, b): VMP's q(tau) is the exact posterior, and every
    ratio p(y, tau) / q(tau) is the evidence, a Student-t density in closed form."""
    y = np.random.default_rng(4).normal(0.0, 2.0, size=30)
    a, b = 2.0, 3.0

    def model(y):
        tau = numpyro.sample("tau", dist.Gamma(a, b))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Normal(0.0, 1.0 / jnp.sqrt(tau)), obs=y)

    result, ratios = _constant_ratio_fit(model, {"y": y})
    n, ss = y.size, float(np.sum(y**2))
    evidence = (
        gammaln(a + n / 2)
        - gammaln(a)
        + a * np.log(b)
        - (a + n / 2) * np.log(b + ss / 2)
        - n / 2 * np.log(2 * np.pi)
    )
    assert np.std(ratios) < 1e-3
    assert np.mean(ratios) == pytest.approx(evidence, abs=1e-3)
    check = result.diagnostics.importance
    assert check.pareto_k < 0.3 and check.ess > 0.999


def test_ratios_are_the_evidence_through_a_joint_group_with_a_constrained_member():
    """a ~ LogNormal(0, 1), b ~ N(log a, 1), y ~ N(b, 1): Gaussian on (log a, b), so the
    joint group's q is exact and every ratio (q's density on a includes the exp map's
    Jacobian) equals the evidence N(y; 0, sqrt(3))."""

    def model(y):
        a = numpyro.sample("a", dist.LogNormal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(jnp.log(a), 1.0))
        numpyro.sample("y", dist.Normal(b, 1.0), obs=y)

    result, ratios = _constant_ratio_fit(model, {"y": 1.3})
    assert result.schedule.joint, "a and b share a joint Gaussian"
    assert np.std(ratios) < 1e-3
    assert np.mean(ratios) == pytest.approx(stats.norm.logpdf(1.3, 0.0, np.sqrt(3.0)), abs=1e-3)


def test_ratios_are_the_evidence_through_a_joint_group_with_masked_members():
    """A covariate with missing values (3 of 12), imputed through ``obs_mask``, that the
    response reads: x ~ N(mu, 1), y ~ N(x, 0.4), mu ~ N(0, 2). q over (mu, x_unobserved)
    is one exact joint Gaussian, and with the masked-out elements given the engine's
    N(0, 1) placeholder density every ratio equals the evidence of the observed values,
    a Gaussian over (x_obs, y) with covariance 4 + the per-point terms."""
    rng = np.random.default_rng(7)
    x = 0.3 + rng.normal(size=12)
    y = x + 0.4 * rng.normal(size=12)
    mask = np.ones(12, bool)
    mask[[2, 7, 9]] = False

    def model(mask, x=None, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
        with numpyro.plate("n", 12):
            filled = numpyro.sample("x", dist.Normal(mu, 1.0), obs=x, obs_mask=mask)
            numpyro.sample("y", dist.Normal(filled, 0.4), obs=y)

    result, ratios = _constant_ratio_fit(model, {"mask": mask, "x": x, "y": y})
    assert result.schedule.joint, "mu and the missing covariates share a joint Gaussian"
    assert result.schedule.leaves == (), "y reads the imputed covariates"
    # (x, y) ~ N(0, 4 11^T + [[I, I], [I, 1.16 I]]); the observed entries' marginal
    cov = 4.0 * np.ones((24, 24)) + np.block(
        [[np.eye(12), np.eye(12)], [np.eye(12), 1.16 * np.eye(12)]]
    )
    keep = np.concatenate([mask, np.ones(12, bool)])
    values = np.concatenate([x, y])[keep]
    evidence = stats.multivariate_normal(np.zeros(keep.sum()), cov[np.ix_(keep, keep)]).logpdf(
        values
    )
    assert np.std(ratios) < 1e-3
    assert np.mean(ratios) == pytest.approx(evidence, abs=1e-3)
    check = result.diagnostics.importance
    assert check is not None and not check.misses_posterior and not check.too_narrow


def _correlated_pair():
    # x ~ N(0, 1), z | x ~ N(0.99 x, sqrt(1 - 0.99^2)): unit marginals, correlation 0.99;
    # one vague observation of z (sd 100) makes z more than a leaf q could hold at its
    # conditional (autocvi.analysis.leaves) while moving the posterior by under 1e-4.
    def model():
        x = numpyro.sample("x", dist.Normal(0.0, 1.0))
        z = numpyro.sample("z", dist.Normal(0.99 * x, np.sqrt(1 - 0.99**2)))
        numpyro.sample("y", dist.Normal(z, 100.0), obs=0.0)

    return model


def test_fit_warns_when_q_misses_the_posterior():
    """Mean-field q of a Gaussian pair correlated at 0.99 has sd sqrt(1 - 0.99^2) = 0.14 along
    each axis, so along the posterior's major axis (sd 1.41) it is ten times too narrow:
    the ratios' tail is Pareto with shape about 1 - 0.14^2 / 1.99 = 0.99 and a few draws
    carry the weight. The joint q (the default) is exact: constant ratios, no warning."""
    with pytest.warns(FitWarning, match="q misses part of the posterior"):
        result = autocvi.fit(_correlated_pair(), {}, structure="mean-field", progress_bar=False)
    check = result.diagnostics.importance
    assert check.pareto_k > K_LIMIT and check.ess < ESS_LIMIT and check.misses_posterior
    with warnings.catch_warnings():
        warnings.simplefilter("error", FitWarning)
        result = autocvi.fit(_correlated_pair(), {}, progress_bar=False)
    check = result.diagnostics.importance
    assert check.pareto_k < 0.3 and check.ess > 0.999 and not check.misses_posterior
    assert not check.too_narrow and check.narrowest.ratio == pytest.approx(1.0, abs=0.05)


def test_effective_sample_fraction():
    assert effective_sample_fraction(np.zeros(100)) == pytest.approx(1.0)
    # one ratio carries all the weight: ESS 1 of 100 draws
    assert effective_sample_fraction(np.r_[np.zeros(99), 50.0]) == pytest.approx(0.01)
    # -inf (zero weight) counts as a draw with no weight
    assert effective_sample_fraction(np.r_[np.zeros(50), [-np.inf] * 50]) == pytest.approx(0.5)


def test_check_false_skips_the_checks():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = autocvi.fit(
            _correlated_pair(), {}, structure="mean-field", check=False, progress_bar=False
        )
    assert result.diagnostics.importance is None
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "misses part" in m or "couples them" in m], messages


ZOO_MISSES = ["china_smoking_meta", "garch11"]
ZOO_NARROW = ["hierarchical_poisson_cancer", "gaussian_mixture_ordered", "gamma_poisson_hierarchy"]
ZOO_FITS = ["uncentred_year_regression", "weibull_survival_heart"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO_MISSES + ZOO_NARROW + ZOO_FITS)
def test_zoo_models_warn_exactly_where_q_misses_the_posterior(name):
    """Against NUTS (the zoo's stored references): china_smoking_meta's q is a funnel's
    Gaussian (tau 0.7 sd off, half NUTS's sd) and garch11's is skewed against its
    stationarity bound (sd ratios 0.6-0.8): both warn that q misses posterior mass.
    hierarchical_poisson_cancer's q matches NUTS's means within 0.06 sd but its sd of
    the scale ``sigma`` is 0.74 of NUTS's, and gaussian_mixture_ordered's sd of its
    top ordered mean 0.63 (q's own draws read 0.86 there; the defensive draws 0.68):
    and gamma_poisson_hierarchy's sd of alpha 0.81 (read 0.85): all warn that q is too
    narrow there, naming the coordinate. The others match NUTS within 0.07 sd and 0.95 of its sds, and stay silent
    although k alone exceeds 0.7 on both (uncentred predictors and a Weibull
    likelihood: tails barely heavier than q's, ESS above 85%)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from zoo.models import MODELS
    from zoo.scoring import reference

    model, data = MODELS[name]()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = autocvi.fit(model, data, progress_bar=False)
    messages = [str(w.message) for w in caught]
    missed = any("q misses part of the posterior" in m for m in messages)
    narrow = any("q is too narrow" in m for m in messages)
    check = result.diagnostics.importance
    assert check is not None
    assert missed == check.misses_posterior == (name in ZOO_MISSES), check
    # a miss is reported once, as a miss (its spread may be narrow too)
    assert narrow == (name in ZOO_NARROW), check
    if name not in ZOO_MISSES:
        assert check.too_narrow == (name in ZOO_NARROW), check
    if name in ZOO_NARROW:  # the warning is deserved: q is that narrow against NUTS
        site, _, index = check.narrowest.coordinate.partition("[")  # "sigma", "mu[2]"
        index = tuple(int(i) for i in index.rstrip("]").split(",") if i)
        nuts_sd = np.asarray(reference(name)["nuts"]["sites"][site]["sd"])[index]
        q_sd = np.asarray(result.sample(jax.random.PRNGKey(1), 4000)[site]).std(0)[index]
        assert q_sd / nuts_sd < SPREAD_LIMIT


def test_the_rule_warns_on_a_heavy_tail_or_on_almost_no_effective_draws():
    """Both rules, at their edges (the check's numbers, no fit)."""
    from autocvi.infer.importance import ESS_FLOOR, K_MODERATE, ImportanceCheck

    def misses(k, ess):
        return ImportanceCheck(k, ess, 4000).misses_posterior

    assert misses(K_LIMIT + 0.01, ESS_LIMIT - 0.001)
    assert not misses(K_LIMIT + 0.3, ESS_LIMIT + 0.001)  # heavy tail, many draws: a good GLM
    assert misses(K_MODERATE + 0.01, ESS_FLOOR - 0.001)
    assert not misses(K_MODERATE - 0.01, ESS_FLOOR - 0.001)
    assert not misses(K_LIMIT - 0.01, ESS_FLOOR + 0.001)


def _rat_tumours():
    """A centred binomial hierarchy as users write it (71 groups, logit-normal effects,
    HalfCauchy scale), data simulated with a fixed seed."""
    rs = np.random.RandomState(4)
    n = rs.randint(10, 51, size=71)
    theta = -1.9 + 0.6 * rs.normal(size=71)
    y = rs.binomial(n, 1 / (1 + np.exp(-theta))).astype(float)

    def model(n, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 2.5))
        sigma = numpyro.sample("sigma", dist.HalfCauchy(1.0))
        with numpyro.plate("groups", n.shape[0]):
            logit_theta = numpyro.sample("logit_theta", dist.Normal(mu, sigma))
            numpyro.sample("y", dist.Binomial(total_count=n, logits=logit_theta), obs=y)

    return model, {"n": n, "y": y}


# NUTS (2 chains x 4000 draws, 2000 warmup, target_accept 0.95, seed 0; no divergences,
# r_hat <= 1.003): mean and sd of sigma. Regenerate with _nuts_moments.
RAT_TUMOURS_SIGMA = (0.603, 0.105)


def _nuts_moments(make_model, site):  # pragma: no cover - regenerates the stored references
    """NUTS's mean and sd of ``site`` (:func:`nuts_reference.nuts_samples`): minutes.
    ``_nuts_moments(_rat_tumours, "sigma")`` regenerates RAT_TUMOURS_SIGMA;
    ``_nuts_moments(_grouped_regression, "tau")`` GROUPED_REGRESSION_TAU."""
    from nuts_reference import nuts_samples

    s = np.asarray(nuts_samples(make_model)[site])
    return round(float(s.mean()), 3), round(float(s.std()), 3)


@pytest.mark.slow
def test_a_centred_binomial_hierarchy_whose_scale_q_narrows_is_flagged():
    """q's sd of the group scale is about 0.68 of NUTS's (a Gaussian's limit: NumPyro's
    AutoMultivariateNormal gives 0.66), with Pareto-k just under 0.7 and ESS 1.4%: the
    second rule (k > 0.5, ESS < 2%) flags it; the first alone stayed silent."""
    result, messages, sd_ratio = _fit_against_nuts(_rat_tumours, "sigma", RAT_TUMOURS_SIGMA)
    assert sd_ratio < 0.8  # q is off: the warning is deserved
    assert any("q misses part of the posterior" in m for m in messages)
    assert result.diagnostics.importance.misses_posterior


def _fit_against_nuts(make_model, site, nuts_moments):
    """``(result, FitWarning messages, q's sd of site / NUTS's)`` of a default fit."""
    model, data = make_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = autocvi.fit(model, data, progress_bar=False)
    draws = np.asarray(result.sample(jax.random.PRNGKey(0), 4000)[site])
    return result, [str(w.message) for w in caught], draws.std() / nuts_moments[1]


def _grouped_regression():
    """A non-centred grouped regression as users write it (12 groups of 15 observations
    indexed by group, HalfCauchy tau, deterministic theta), data simulated with a fixed
    seed. q is one joint Gaussian over (mu, tau, sigma, z): NumPyro's
    AutoMultivariateNormal reaches the same narrow tau."""
    rs = np.random.RandomState(1)
    g = np.repeat(np.arange(12), 15)
    y = (1.0 + 0.7 * rs.normal(size=12))[g] + rs.normal(0.0, 2.0, size=g.size)

    def model(g, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(1.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
        with numpyro.plate("groups", 12):
            z = numpyro.sample("z", dist.Normal(0.0, 1.0))
            theta = numpyro.deterministic("theta", mu + tau * z)
        with numpyro.plate("obs", g.shape[0]):
            numpyro.sample("y", dist.Normal(theta[g], sigma), obs=y)

    return model, {"g": g, "y": y}


# NUTS (2 chains x 4000 draws, 2000 warmup, target_accept 0.95, seed 0; no divergences,
# r_hat 1.00, n_eff >= 2400): mean and sd of tau. Regenerate with _nuts_moments.
GROUPED_REGRESSION_TAU = (0.847, 0.259)


@pytest.mark.slow
def test_a_non_centred_scale_q_narrows_is_flagged_too_narrow():
    """q's sd of tau is about 0.6 of NUTS's, with healthy k (0.37) and ESS (34%): the
    first rule is silent, the spread rule names tau (weighted ratio about 0.81)."""
    result, messages, sd_ratio = _fit_against_nuts(
        _grouped_regression, "tau", GROUPED_REGRESSION_TAU
    )
    assert sd_ratio < 0.75  # q is off: the warning is deserved
    check = result.diagnostics.importance
    assert not check.misses_posterior and check.too_narrow, check
    assert check.narrowest.coordinate == "tau"
    assert any("q is too narrow at 'tau'" in m for m in messages)


def test_checks_of_q_against_the_posterior_run_with_the_elbo_only():
    """The beta-ELBO with beta = 0.25 aims q at the posterior tempered to 4x the
    likelihood's weight, half as wide, by design: no check of q against the posterior
    runs, and nothing warns. The same model under the ELBO is checked (and exact)."""
    x = np.linspace(-1.0, 1.0, 12)
    y = 0.5 + 1.5 * x + 0.4 * np.random.default_rng(7).normal(size=12)

    def model(x, y=None):
        a = numpyro.sample("a", dist.Normal(0.0, 2.0))
        b = numpyro.sample("b", dist.Normal(0.0, 2.0))
        with numpyro.plate("n", x.shape[0]):
            numpyro.sample("y", dist.Normal(a + b * x, 0.4), obs=y)

    data = {"x": x, "y": y}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FitWarning)
        tempered = autocvi.fit(model, data, objective=autocvi.BetaELBO(0.25), progress_bar=False)
        exact = autocvi.fit(model, data, progress_bar=False)
    assert tempered.diagnostics.importance is None
    assert exact.diagnostics.importance.ess > 0.999


def _truncated_normal():
    """Positive measurements as a user writes them: TruncatedNormal(mu, sigma, low=0)."""
    rs = np.random.RandomState(33)
    z = rs.normal(0.3, 1.0, size=400)
    y = z[z > 0][:60]

    def model(y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
        with numpyro.plate("N", 60):
            numpyro.sample("y", dist.TruncatedNormal(mu, sigma, low=0.0), obs=y)

    return model, {"y": y}


def _truncated_normal_exact_mu(y):
    """Mean and sd of mu's exact marginal: the posterior on a 600 x 500 grid (scipy)."""
    mu = np.linspace(-9.0, 3.0, 600)[:, None]
    sigma = np.linspace(0.2, 6.0, 500)[None, :]
    a = (0.0 - mu) / sigma
    loglik = sum(stats.truncnorm.logpdf(v, a, np.inf, loc=mu, scale=sigma) for v in y)
    logp = loglik + stats.norm.logpdf(mu, 0.0, 3.0) + stats.halfnorm.logpdf(sigma, scale=2.0)
    w = np.exp(logp - logp.max())
    w_mu = w.sum(axis=1) / w.sum()
    mean = float(w_mu @ mu[:, 0])
    return mean, float(np.sqrt(w_mu @ (mu[:, 0] - mean) ** 2))


def test_a_gaussian_q_narrower_than_the_exact_posterior_warns_with_two_coordinates():
    """A truncated-normal likelihood's (mu, sigma) posterior is a banana with a long
    left tail in mu (exact grid: sd 1.30); the best Gaussian q (SVI's
    AutoMultivariateNormal too) keeps about 0.45 of it. The spread rule reads mu's sd at
    0.79 of the weighted draws' at z 3.6: among two coordinates that counts (a fixed
    z >= 4 left it silent, converged=True)."""
    model, data = _truncated_normal()
    _, exact_sd = _truncated_normal_exact_mu(data["y"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = autocvi.fit(model, data, progress_bar=False)
    q_sd = float(np.std(result.sample(jax.random.PRNGKey(1), 8000)["mu"]))
    assert q_sd / exact_sd < 0.6  # the warning is deserved
    check = result.diagnostics.importance
    assert check.narrowest.coordinate == "mu" and check.narrowest.z_limit == SPREAD_Z_MIN
    assert check.too_narrow, check
    assert any("q is too narrow at 'mu'" in str(w.message) for w in caught)


def _switchpoint_data():
    rng = np.random.default_rng(12)
    return np.concatenate([rng.poisson(3.0, 40), rng.poisson(1.0, 70)]).astype(float)


def switchpoint(y):
    """Coal-mining style, as users write it: a uniform Categorical switchpoint."""
    T = y.shape[0]
    early = numpyro.sample("early", dist.Exponential(1.0))
    late = numpyro.sample("late", dist.Exponential(1.0))
    tau = numpyro.sample("tau", dist.Categorical(probs=jnp.ones(T) / T))
    rate = jnp.where(jnp.arange(T) < tau, early, late)
    with numpyro.plate("years", T):
        numpyro.sample("y", dist.Poisson(rate), obs=y)


def test_a_switchpoint_whose_mean_field_q_is_too_narrow_is_flagged():
    """Mean-field q(tau) q(early) q(late) of a Poisson switchpoint: q(tau)'s sd is 0.60
    of the exact posterior's (enumerated below: Gamma-Poisson in closed form per tau).
    Before, models with any discrete latent skipped the check and this fit said
    nothing."""
    y = _switchpoint_data()
    T = y.size
    # exact: Exponential(1) = Gamma(1, 1), summed over tau
    s1 = np.r_[0.0, np.cumsum(y)[:-1]]
    n1 = np.arange(T)
    s2, n2 = y.sum() - s1, T - n1
    log_w = gammaln(1 + s1) - (1 + s1) * np.log(1 + n1)
    log_w += gammaln(1 + s2) - (1 + s2) * np.log(1 + n2)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    exact_sd = np.sqrt(w @ n1**2 - (w @ n1) ** 2)
    with pytest.warns(FitWarning, match="'tau'.*discrete"):
        result = autocvi.fit(switchpoint, {"y": jnp.asarray(y)}, progress_bar=False)
    probs = np.asarray(result.posterior["tau"].probs, float)
    q_sd = np.sqrt(probs @ n1**2 - (probs @ n1) ** 2)
    assert q_sd / exact_sd < 0.8  # the warning is right: q is too narrow
    assert result.diagnostics.importance is not None
    assert result.diagnostics.importance.too_narrow


def test_a_global_discrete_latent_that_q_gets_right_is_checked_without_a_warning():
    """The other side of the switchpoint: a Categorical whose posterior q represents
    exactly (it shares no factor with the continuous latent), checked and not flagged."""
    rng = np.random.default_rng(3)
    centres = jnp.asarray([-2.0, 0.0, 2.0])
    y = jnp.asarray(centres[1] + rng.normal(size=4))
    x = jnp.asarray(1.5 + rng.normal(size=30))

    def model(y, x):
        z = numpyro.sample("z", dist.Categorical(probs=jnp.ones(3) / 3))
        m = numpyro.sample("m", dist.Normal(0.0, 10.0))
        with numpyro.plate("ys", y.shape[0]):
            numpyro.sample("y", dist.Normal(centres[z], 1.0), obs=y)
        with numpyro.plate("xs", x.shape[0]):
            numpyro.sample("x", dist.Normal(m, 1.0), obs=x)

    with warnings.catch_warnings():
        warnings.simplefilter("error", FitWarning)
        result = autocvi.fit(model, {"y": y, "x": x}, progress_bar=False)
    check = result.diagnostics.importance
    assert check is not None and not check.too_narrow and not check.misses_posterior
    # and q(z) is the exact posterior over the three centres
    log_post = np.array([stats.norm.logpdf(np.asarray(y), c, 1.0).sum() for c in centres])
    exact = np.exp(log_post - log_post.max())
    exact /= exact.sum()
    np.testing.assert_allclose(np.asarray(result.posterior["z"].probs), exact, atol=1e-4)


def _truncated_prior(y):
    """A mean known to be positive, as a user writes it: a TruncatedNormal prior."""
    mu = numpyro.sample("mu", dist.TruncatedNormal(0.0, 1.0, low=0.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.mark.parametrize("n, ybar", [(100, -0.5), (10, -1.0), (30, 1.5)])
def test_q_too_wide_against_a_bound_is_flagged_and_only_there(n, ybar):
    """The exact posterior is Normal(n ybar / (n + 1), 1 / (n + 1)) truncated at 0
    (scipy's truncnorm). Where the data pull the mean below the bound, the posterior
    piles against 0 and q, a Gaussian in log mu, is 1.2-1.3x its sd (no warning used
    to say so): the fit warns that q is too wide at 'mu', and is right to. Where the
    posterior sits well above 0, q matches it and nothing warns."""
    e = np.random.RandomState(0).normal(size=n)
    y = (e - e.mean()) / e.std() + ybar
    loc, scale = n * ybar / (n + 1), 1.0 / np.sqrt(n + 1)
    exact = stats.truncnorm(-loc / scale, np.inf, loc, scale)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = autocvi.fit(_truncated_prior, {"y": y}, progress_bar=False)
    wide = [str(w.message) for w in caught if "q is too wide at 'mu'" in str(w.message)]
    q_sd = float(np.asarray(result.sample(jax.random.PRNGKey(1), 20000)["mu"]).std())
    check = result.diagnostics.importance
    if ybar < 0:
        assert q_sd / exact.std() > 1.2  # the warning is deserved
        assert check.too_wide and check.widest.coordinate == "mu" and len(wide) == 1
    else:
        assert q_sd / exact.std() == pytest.approx(1.0, abs=0.05)
        assert not check.too_wide and not wide
    assert not check.too_narrow and not check.misses_posterior


def test_a_spread_the_first_look_cannot_decide_is_read_again(monkeypatch):
    """The zoo's mixture with an empty component (``mixture_empty_component``): NUTS
    (its stored reference) says q's sd of the empty weight w[1] is about 1.3x the
    posterior's. The first look's 4,000 + 4,000 draws read that at about 2.3 standard
    errors, below the limit of 3, and the fit used to stay silent; the second look reads
    it again on more draws and warns. Both looks are checked: without the second, the
    same fit does not flag it. The Monte Carlo fit and the check's draws move the reading
    with ``rng_key`` (w[1]'s sd ratio 1.08-1.32 over keys 0-4, warned on two of them):
    key 3 is one whose first look cannot decide."""
    sys.path.insert(0, str(Path(__file__).parent))
    from zoo.models import MODELS
    from zoo.scoring import reference

    model, data = MODELS["mixture_empty_component"]()
    nuts_sd = reference("mixture_empty_component")["nuts"]["sites"]["w"]["sd"][1]

    def fit():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = autocvi.fit(model, data, progress_bar=False, rng_key=jax.random.PRNGKey(3))
        return result, [str(w.message) for w in caught if issubclass(w.category, FitWarning)]

    result, warned = fit()
    q_sd = float(np.asarray(result.sample(jax.random.PRNGKey(1), 20000)["w"])[:, 1].std())
    check = result.diagnostics.importance
    assert q_sd / nuts_sd > 1.2  # the warning is deserved
    assert check.spread_looks > 1 and check.too_wide
    assert check.widest.coordinate == "w[1]"
    assert check.widest.ratio == pytest.approx(q_sd / nuts_sd, rel=0.1)
    assert [w for w in warned if "q is too wide at 'w[1]'" in w] == warned and len(warned) == 1
    assert f"{check.num_draws * check.spread_looks} draws from q" in warned[0]

    monkeypatch.setattr("autocvi.infer.importance.SECOND_LOOK_DRAWS", 0)
    first_look, warned = fit()
    check = first_look.diagnostics.importance
    assert check.spread_looks == 1 and check.widest.coordinate == "w[1]"
    assert check.widest.ratio > 1.2 and not check.too_wide and not warned


def _zoo():
    sys.path.insert(0, str(Path(__file__).parent))
    from zoo import models, scoring

    return models.MODELS, scoring


@pytest.mark.parametrize("name", ["normal_mixture_assignments", "iris_mixture"])
def test_summing_the_assignments_out_gives_the_marginal_models_density(name):
    """The check's log density with the plated assignments z summed out equals numpyro's
    log density of the same model written with them summed out (MixtureSameFamily), at
    values of the other latents drawn from their priors."""
    from numpyro.infer.util import log_density

    from autocvi.infer.importance import summed_log_joint, summed_site

    MODELS, _ = _zoo()
    model, data = MODELS[name]()
    marginal, _ = MODELS[f"{name}_marginal"]()
    summed = summed_site(autocvi.plan(model, data).graph)
    assert summed is not None and summed.name == "z"
    y = jnp.asarray(data["y"], jnp.float32)
    for seed in range(3):
        prior = numpyro.handlers.trace(numpyro.handlers.seed(marginal, seed)).get_trace(y)
        values = {k: v["value"] for k, v in prior.items() if k != "y"}
        ours, _ = summed_log_joint(model, {"y": y}, values, summed)
        exact, _ = log_density(marginal, (y,), {}, values)
        assert float(ours) == pytest.approx(float(exact), rel=1e-5)


def test_q_with_mean_field_assignments_is_checked_against_the_marginal_posterior():
    """q over a mixture's parameters with the assignments z mean-field (VMP) used to go
    unchecked (the importance ratios counted z's N elements). The check now sums z out
    of p and reads q's other latents against their marginal posterior: on iris, where
    assignments overlap, q's component locations are narrower than NUTS's (the zoo's
    stored reference) and the fit says so; on well-separated components q matches NUTS
    and the fit is silent."""
    MODELS, scoring = _zoo()

    def fit(name):
        model, data = MODELS[name]()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = autocvi.fit(model, data, progress_bar=False)
        draws = result.sample(jax.random.PRNGKey(0), 4000)
        warned = [str(w.message) for w in caught if issubclass(w.category, FitWarning)]
        return result.diagnostics.importance, warned, draws, scoring.reference(name)

    check, warned, draws, ref = fit("iris_mixture")
    assert check.summed_site == "z" and check.too_narrow and len(warned) == 1
    site = check.narrowest.coordinate.split("[")[0]
    assert f"q is too narrow at {check.narrowest.coordinate!r}" in warned[0]
    assert "summed the discrete latent 'z' out" in warned[0]
    others = [s for s in ref["nuts"]["sites"] if s != site]
    _, ratio = scoring.scores("iris_mixture", draws, ref, exclude=others)
    assert np.median(ratio) < 0.9  # deserved: NUTS's sds there are wider

    check, warned, draws, ref = fit("normal_mixture_assignments")
    assert check.summed_site == "z" and not warned
    z, ratio = scoring.scores("normal_mixture_assignments", draws, ref)
    assert np.all((0.9 < ratio) & (ratio < 1.1)) and np.max(z) < 0.1  # silence deserved


def test_plan_says_an_enumeration_request_is_not_honoured():
    """``config_enumerate`` asks NumPyro to sum z out; autocvi keeps q(z) mean-field. The
    plan says so, naming the site; the same model without the request gets no such
    line, and neither does a model with no discrete latent."""
    MODELS, _ = _zoo()
    model, data = MODELS["normal_mixture_assignments"]()
    # what config_enumerate sets (it needs funsor, which the test extra does not install)
    enumerate_z = {"enumerate": "parallel"}
    config = numpyro.handlers.infer_config(
        model, config_fn=lambda site: enumerate_z if site["name"] == "z" else {}
    )
    marked = str(autocvi.plan(config, data))
    assert "'z': marked for enumeration" in marked and "MixtureSameFamily" in marked
    assert "marked for enumeration" not in str(autocvi.plan(model, data))
    marginal, data = MODELS["normal_mixture_assignments_marginal"]()
    assert "marked for enumeration" not in str(autocvi.plan(marginal, data))
