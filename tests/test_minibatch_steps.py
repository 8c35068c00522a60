"""Steps of minibatched global nodes without site memory (N/B-scaled messages).

Two silent failures of the plain minibatch step, on models as users write them:

* an unsafeguarded step: a linear regression with a separate intercept, a feature
  plate and a half-normal scale, minibatched (N = 2,000, B = 100), took a Monte Carlo
  message at its third iteration that threw q 750 posterior sds away and collapsed its
  variances (rng key 1). The step is now searched on its batch's ELBO like every other
  estimated step.
* a start chosen blind: the candidates for a joint group's start are scored by the
  model's log density, which numpyro cannot evaluate with a subsampled plate outside a
  seed handler, so every score was NaN and the prior median won; a Poisson GLM whose
  intercept prior is Normal(0, 5) started at -3.7 and its first step went to 41 (every
  key; loud), a negative-binomial GLM fell into its phi -> 0 optimum 10,000 nats down
  and said converged (silent). They are now scored on the whole data.
* a first step far from the data: a negative-binomial GLM on statsmodels' randhie
  (N = 5,000, B = 250, nine standardised covariates, one a rare binary with values up
  to 9) started at the centre of its unconstrained space; its first N/B-scaled step
  set that covariate's coefficient to 7.9, 400 posterior sd out, where float32's exp
  overflowed and every later message was NaN, and the NaN messages were recorded as
  steps taken: it stopped 47 sd from the posterior saying converged (rng key 2). A
  minibatched fit's joint groups now start at the whole data's mode, and a message
  that is not finite is a refused step that makes the fit untrustworthy.
* a stopping rule fooled by decaying steps: with ``step_size_decay=0.9`` a minibatched
  logistic regression (``site_memory=False``) moved so little per chunk that the rule
  stopped it after 46 iterations, 0.9 sd short, saying converged.

Oracles: ordinary least squares (the posterior of a regression on 2,000 points under
weak priors is OLS's estimate and standard errors to a few hundredths of an sd) and the
MAP of the logistic regression with its Laplace sds (scikit-learn's L2-penalised
logistic regression with C = 1 is the mode under the N(0, 1) prior).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer.util import log_density
from sklearn.linear_model import LogisticRegression, PoissonRegressor

import autocvi
from autocvi.infer.fit import MOVE_LIMIT, transient_left
from autocvi.model.trace import full_plates

N, D, B = 2000, 5, 100


def regression(X, y=None, B=None):
    a = numpyro.sample("a", dist.Normal(0, 2))
    with numpyro.plate("features", X.shape[1]):
        b = numpyro.sample("b", dist.Normal(0, 1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=B) as idx:
        numpyro.sample("y", dist.Normal(a + X[idx] @ b, sigma), obs=y[idx])


def regression_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D))
    y = X @ rng.normal(size=D) + 0.5 + 0.7 * rng.normal(size=N)
    return X, y


def least_squares(X, y):
    """OLS estimates and standard errors of (a, b), and the residual sd."""
    A = np.column_stack([np.ones(len(y)), X])
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    resid = y - A @ coef
    s2 = resid @ resid / (len(y) - A.shape[1])
    se = np.sqrt(np.diag(s2 * np.linalg.inv(A.T @ A)))
    return coef, se, np.sqrt(s2)


@pytest.mark.parametrize("seed", [1, 3])
def test_a_minibatched_regression_with_a_half_normal_scale_reaches_least_squares(seed):
    X, y = regression_data()
    coef, se, sigma = least_squares(X, y)
    data = {"X": jnp.asarray(X), "y": jnp.asarray(y), "B": B}
    result = autocvi.fit(regression, data, rng_key=jax.random.PRNGKey(seed))
    post = result.posterior
    mean = np.concatenate([np.atleast_1d(post["a"].mean), np.asarray(post["b"].mean)])
    sd = np.sqrt(np.concatenate([np.atleast_1d(post["a"].variance), post["b"].variance]))
    assert result.converged
    assert np.max(np.abs(mean - coef) / se) < 0.5
    assert np.all(np.abs(sd / se - 1) < 0.15)
    # sigma's posterior sd is about sigma / sqrt(2 N)
    assert abs(float(post["sigma"].mean) - sigma) < 0.5 * sigma / np.sqrt(2 * N)


def poisson_glm(X, y=None, B=None):
    b0 = numpyro.sample("b0", dist.Normal(0, 5))
    with numpyro.plate("features", X.shape[1]):
        w = numpyro.sample("w", dist.Normal(0, 1))
    with numpyro.plate("data", X.shape[0], subsample_size=B) as idx:
        numpyro.sample("y", dist.Poisson(jnp.exp(b0 + X[idx] @ w)), obs=y[idx])


def poisson_data():
    rng = np.random.default_rng(1)
    X = 0.5 * rng.normal(size=(N, 4))
    y = rng.poisson(np.exp(0.3 + X @ np.array([0.5, -0.3, 0.2, 0.0]))).astype(float)
    return X, y


def test_the_full_plates_handler_gives_numpyros_full_data_log_density():
    X, y = poisson_data()
    values = {"b0": jnp.asarray(0.2), "w": jnp.asarray([0.4, -0.2, 0.1, 0.05])}
    full, _ = log_density(poisson_glm, (jnp.asarray(X), jnp.asarray(y)), {}, values)
    with pytest.raises(ValueError, match="Missing random key"):
        log_density(poisson_glm, (jnp.asarray(X), jnp.asarray(y), B), {}, values)
    handled, _ = log_density(
        full_plates(poisson_glm), (jnp.asarray(X), jnp.asarray(y), B), {}, values
    )
    assert float(handled) == pytest.approx(float(full), rel=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_minibatched_poisson_glm_with_a_wide_intercept_prior_reaches_the_mle(seed):
    """Every key failed before (started at the prior median, first step to b0 = 41)."""
    X, y = poisson_data()
    mle = PoissonRegressor(alpha=0.0, tol=1e-10, max_iter=1000).fit(X, y)
    coef = np.r_[mle.intercept_, mle.coef_]
    A = np.column_stack([np.ones(N), X])
    rate = np.exp(A @ coef)
    se = np.sqrt(np.diag(np.linalg.inv(A.T @ (A * rate[:, None]))))
    data = {"X": jnp.asarray(X), "y": jnp.asarray(y), "B": B}
    result = autocvi.fit(poisson_glm, data, rng_key=jax.random.PRNGKey(seed))
    post = result.posterior
    mean = np.r_[float(post["b0"].mean), np.asarray(post["w"].mean)]
    sd = np.sqrt(np.r_[float(post["b0"].variance), np.asarray(post["w"].variance)])
    assert result.converged
    assert np.max(np.abs(mean - coef) / se) < 0.3
    assert np.all(np.abs(sd / se - 1) < 0.15)


def negative_binomial_glm(X, y=None, B=None):
    b0 = numpyro.sample("b0", dist.Normal(0, 5))
    with numpyro.plate("features", X.shape[1]):
        w = numpyro.sample("w", dist.Normal(0, 1))
    phi = numpyro.sample("phi", dist.Exponential(1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=B) as idx:
        numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(b0 + X[idx] @ w), phi), obs=y[idx])


def test_a_minibatched_negative_binomial_glm_does_not_settle_in_its_phi_to_zero_optimum():
    """rng key 2 started at the prior median (b0 = -3.7), fell to b0 = 16.7, phi = 0.001,
    and said converged with no warning. Oracle: statsmodels' NB2 maximum likelihood."""
    from statsmodels.discrete.discrete_model import NegativeBinomial

    rng = np.random.default_rng(6)
    X = 0.5 * rng.normal(size=(N, 3))
    mu = np.exp(1.0 + X @ np.array([0.5, -0.3, 0.2]))
    y = rng.poisson(rng.gamma(3.0, mu / 3.0)).astype(float)
    mle = NegativeBinomial(y, np.column_stack([np.ones(N), X]), loglike_method="nb2").fit(
        disp=0, maxiter=200
    )
    coef, se = np.asarray(mle.params[:4]), np.asarray(mle.bse[:4])
    data = {"X": jnp.asarray(X), "y": jnp.asarray(y), "B": B}
    result = autocvi.fit(negative_binomial_glm, data, rng_key=jax.random.PRNGKey(2))
    post = result.posterior
    mean = np.r_[float(post["b0"].mean), np.asarray(post["w"].mean)]
    assert result.converged
    assert np.max(np.abs(mean - coef) / se) < 0.5
    # statsmodels' alpha is 1 / phi
    assert float(post["phi"].mean) == pytest.approx(1.0 / float(mle.params[4]), rel=0.15)


def negative_binomial_regression(X, y=None, B=None):
    """As users write it: a coefficient vector, an intercept, a half-normal dispersion."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    phi = numpyro.sample("phi", dist.HalfNormal(5.0))
    with numpyro.plate("n", X.shape[0], subsample_size=B) as idx:
        numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(X[idx] @ w + b), phi), obs=y[idx])


@pytest.mark.slow
def test_a_minibatched_negative_binomial_glm_with_a_rare_covariate_reaches_the_mle():
    """statsmodels' randhie, first 5,000 rows, B = 250, rng key 2: before, the first
    step threw the rare covariate's coefficient 400 sd out, every later message was NaN
    (float32 exp overflow) and the fit said converged 47 sd from the posterior. Oracle:
    statsmodels' NB2 maximum likelihood (5,000 points under weak priors)."""
    import statsmodels.api as sm
    from statsmodels.discrete.discrete_model import NegativeBinomial

    frame = sm.datasets.randhie.load_pandas().data.iloc[:5000]
    X = frame.drop(columns="mdvis").to_numpy(float)
    X = (X - X.mean(0)) / X.std(0)
    y = frame["mdvis"].to_numpy(float)
    assert X[:, 8].max() > 8  # the rare binary covariate the first step overshot on
    mle = NegativeBinomial(y, np.column_stack([X, np.ones(len(y))]), loglike_method="nb2").fit(
        disp=0, maxiter=500
    )
    coef, se = np.asarray(mle.params[:10]), np.asarray(mle.bse[:10])
    data = {"X": jnp.asarray(X), "y": jnp.asarray(y), "B": 250}
    result = autocvi.fit(
        negative_binomial_regression, data, rng_key=jax.random.PRNGKey(2), progress_bar=False
    )
    post = result.posterior
    mean = np.r_[np.asarray(post["w"].mean), float(post["b"].mean)]
    sd = np.sqrt(np.r_[np.asarray(post["w"].variance), float(post["b"].variance)])
    assert result.converged
    assert np.max(np.abs(mean - coef) / se) < 0.5
    assert np.all(np.abs(sd / se - 1) < 0.15)
    # statsmodels' alpha is 1 / phi
    assert float(post["phi"].mean) == pytest.approx(1.0 / float(mle.params[10]), rel=0.1)


def test_a_node_whose_message_is_not_finite_is_refused_and_the_fit_says_so():
    """A negative-binomial mean exp(b) started at b = 70: in float32 the gradient of
    numpyro's log density is NaN there (its value is finite), so the node cannot move.
    Before, each NaN message was recorded as a full step taken, the ELBO stood still,
    and the fit said converged at the start."""
    rng = np.random.default_rng(0)
    y = jnp.asarray(rng.poisson(3.0, size=50).astype(float))

    def model(y):
        b = numpyro.sample("b", dist.Normal(0.0, 100.0))
        phi = numpyro.sample("phi", dist.HalfNormal(5.0))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(b), phi), obs=y)

    start = numpyro.infer.init_to_value(values={"b": 70.0, "phi": 1.0})
    with pytest.warns(autocvi.FitWarning, match="was not finite") as caught:
        result = autocvi.fit(model, {"y": y}, init_strategy=start, num_steps=60, progress_bar=False)
    assert not result.converged
    assert result.diagnostics.non_finite_messages
    ((name, count),) = result.diagnostics.non_finite_messages.items()
    assert count == len(result.elbo)  # every iteration run
    assert any(name in str(w.message) and "float64" in str(w.message) for w in caught)


def logistic(X, y=None, B=None):
    b = numpyro.sample("b", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=B) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ b), obs=y[idx])


@pytest.fixture(scope="module")
def logistic_problem():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D))
    y = (rng.random(N) < 1 / (1 + np.exp(-(X @ rng.normal(size=D))))).astype(float)
    mode = LogisticRegression(C=1.0, fit_intercept=False, tol=1e-10).fit(X, y).coef_[0]
    p = 1 / (1 + np.exp(-(X @ mode)))
    laplace_sd = np.sqrt(np.diag(np.linalg.inv(X.T @ (X * (p * (1 - p))[:, None]) + np.eye(D))))
    data = {"X": jnp.asarray(X, jnp.float32), "y": jnp.asarray(y, jnp.float32), "B": B}
    return data, mode, laplace_sd


def _off(posterior, mode, sd):
    return np.max(np.abs(np.asarray(posterior["b"].mean) - mode) / sd)


@pytest.mark.parametrize("decay", [0.9, 1.0])
def test_fast_decaying_minibatch_steps_are_not_called_converged_short_of_the_optimum(
    logistic_problem, decay
):
    data, mode, sd = logistic_problem
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = autocvi.fit(logistic, data, site_memory=False, step_size_decay=decay)
        cvi = autocvi.CVI(logistic, site_memory=False, step_size_decay=decay)
        run = cvi.run(jax.random.PRNGKey(0), 500, data["X"], data["y"], B=B)
    # Converged means at the optimum (before the fix: 46 iterations, 0.92 sd off) ...
    assert not result.converged or _off(result.posterior, mode, sd) < 0.3
    assert not run.converged or _off(cvi.get_posterior(run.state), mode, sd) < 0.3
    # ... and a fit that is not says so.
    if not result.converged:
        assert any("step_size_decay" in str(w.message) for w in caught)
    if decay == 1.0:
        # beta_t = 0.5 / (1 + t): 500 iterations leave q ~0.5 sd short; it must say so.
        assert not result.converged and not run.converged


def test_minibatch_steps_that_decay_at_the_default_rate_or_are_held_converge(logistic_problem):
    """Completeness: the rule still stops fits that reach the optimum."""
    data, mode, sd = logistic_problem
    memory = autocvi.fit(logistic, data)  # site memory: constant step
    assert memory.converged and _off(memory.posterior, mode, sd) < 0.1
    plain = autocvi.fit(logistic, data, site_memory=False)  # decay 0.6
    assert plain.converged and _off(plain.posterior, mode, sd) < 0.35


class _Distance:
    nodes = ("x",)

    def __call__(self, a, b):
        return abs(a - b)


def test_the_transient_bound_is_exact_for_a_linear_damped_iteration():
    """x <- (1 - beta_t) x + beta_t x*: what is left, |x* - x_t|, is P / (1 - P) times how
    far x moved, for decaying, constant and refused steps."""
    shift = _Distance()
    for sizes in (
        0.5 / (1.0 + np.arange(200)),
        np.full(30, 0.5),
        np.r_[np.full(5, 0.3), np.zeros(5), 0.2 / (1.0 + np.arange(50)) ** 0.9],
    ):
        x0, target, x = 3.0, -1.5, 3.0
        for b in sizes:
            x = (1 - b) * x + b * target
        left = transient_left(shift, x0, x, {"x": list(sizes)})
        assert left == pytest.approx(abs(target - x), rel=1e-9)
    assert transient_left(shift, 0.0, 5.0, {"x": [1.0, 0.3]}) < 1e-9  # a full step
    assert transient_left(shift, 0.0, 5.0, {"x": [0.5] * 30}) < 1e-6 * MOVE_LIMIT


def test_the_importance_check_judges_a_minibatched_q_on_the_whole_data():
    """A minibatched regression on an uncentred covariate (intercept and slope correlated
    at -0.98): mean-field q misses the posterior and the check says so; the joint q (the
    default) passes it. Before, minibatched models skipped the check."""
    rng = np.random.default_rng(0)
    x = 5.0 + rng.normal(size=N)
    y = 1.0 + 0.5 * x + rng.normal(size=N)

    def model(x, y, B=B):
        a = numpyro.sample("a", dist.Normal(0.0, 10.0))
        b = numpyro.sample("b", dist.Normal(0.0, 10.0))
        with numpyro.plate("data", x.shape[0], subsample_size=B) as idx:
            numpyro.sample("y", dist.Normal(a + b * x[idx], 1.0), obs=y[idx])

    data = {"x": jnp.asarray(x), "y": jnp.asarray(y)}
    with pytest.warns(autocvi.FitWarning, match="q misses part of the posterior"):
        result = autocvi.fit(model, data, structure="mean-field", progress_bar=False)
    assert result.diagnostics.importance.misses_posterior
    with warnings.catch_warnings():
        warnings.simplefilter("error", autocvi.FitWarning)
        result = autocvi.fit(model, data, progress_bar=False)
    check = result.diagnostics.importance
    assert check is not None and not check.misses_posterior and not check.too_narrow
    assert check.ess > 0.5
