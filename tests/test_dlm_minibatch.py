"""Log-loss DLM with minibatches: a likelihood in a subsampled plate (issue 16, "one large
data set with minibatches").

The DLM objective ``sum_n log E_q[p(y_n | f_n)] / beta - KL`` is a sum over the data, so
``(N / B) sum_{n in batch}`` of its terms estimates it without bias (Wei, Sheth & Khardon
2021, Sec. 4); numpyro's subsample scale multiplies the log density, which sits inside the
log of the expectation, so the planner moves it outside. Oracle: L-BFGS on the full-data
objective over ``(m, L)`` (``test_objectives.scipy_optimum``), with the logistic
likelihood's ``log E[sigmoid]`` by 200-node Gauss-Hermite in numpy's rule."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from test_objectives import scipy_optimum

import autocvi

pytestmark = pytest.mark.float64

BETA = 0.5


def logistic_regression(X, y=None, batch=None):
    """As users write it: a feature plate, a separate intercept, a subsampled data plate."""
    with numpyro.plate("features", X.shape[1]):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=batch) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w + b), obs=y[idx])


def data(n=400):
    rng = np.random.RandomState(0)
    X = rng.randn(n, 3)
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3 + rng.randn(n) > 0).astype(float)
    return jnp.asarray(X), jnp.asarray(y)


def dlm_optimum(X, y):
    """The full-data log-loss DLM optimum over q(w, b) = N(m, V) (prior N(0, I))."""
    Z = jnp.column_stack([X, jnp.ones(X.shape[0])])
    nodes, weights = np.polynomial.hermite_e.hermegauss(200)
    log_w = jnp.log(jnp.asarray(weights) / np.sqrt(2 * np.pi))

    def objective(m, V):
        mu = Z @ m
        sd = jnp.sqrt(jnp.einsum("nd,de,ne->n", Z, V, Z))
        f = mu[:, None] + sd[:, None] * jnp.asarray(nodes)[None]
        log_p = jnp.where(y[:, None] > 0, jax.nn.log_sigmoid(f), jax.nn.log_sigmoid(-f))
        reward = jax.scipy.special.logsumexp(log_p + log_w, axis=1)
        kl = 0.5 * (jnp.trace(V) + m @ m - 4 - jnp.linalg.slogdet(V)[1])
        return jnp.sum(reward) / BETA - kl

    return scipy_optimum(objective, 4)


@pytest.mark.parametrize("seed", [0, 1])
def test_minibatched_dlm_reaches_the_full_data_optimum(seed):
    """With the memory of per-point gradients (the default): SAGA's estimate vanishes at
    the full-data optimum, so the fit stops there (measured: 0.001 sd in the means, the sds
    to 0.1%, in 93-94 iterations); without it the fit stopped 0.15 sd away saying it had
    converged."""
    result, mean_error, sd_ratio = against_the_optimum(rng_key=seed)
    assert result.converged
    assert mean_error < 0.02
    np.testing.assert_allclose(sd_ratio, 1.0, rtol=0.01)
    # the plan says the minibatch's gradients are held in memory
    text = str(result.schedule)
    assert "data[100/400]" in text and "one gradient and curvature per element" in text


def test_minibatched_dlm_without_memory_lands_near_the_optimum():
    """``site_memory=False``: N/B-scaled minibatch gradients with decaying steps. The
    stopping rule stops once q's means move less than 0.25 sd and its sds less than 5% per
    20-iteration chunk, which the decayed steps reach before the optimum: the means stop
    within 0.2 sd and the sds 3-10% short, never wide (measured: 0.13 sd at 153 iterations
    from the prior median; 0.17 sd at 101 iterations from the start the whole data's log
    density chooses, which the minibatched planner could not evaluate before)."""
    result, mean_error, sd_ratio = against_the_optimum(site_memory=False)
    assert result.converged
    assert mean_error < 0.2
    np.testing.assert_allclose(sd_ratio, 1.0, rtol=0.12)
    assert np.all(sd_ratio < 1.02)  # short, never wide: the sds grow towards the optimum
    assert "held in memory" not in str(result.schedule)


def against_the_optimum(**options):
    """A minibatched fit and how far it is from the full-data optimum: (result, the means'
    largest error in the optimum's sds, the sds' ratios to the optimum's)."""
    X, y = data()
    mean, cov = dlm_optimum(X, y)
    sd = np.sqrt(np.diag(cov))
    result = fit_minibatched(X, y, **options)
    got, got_sd = moments(result)
    return result, np.max(np.abs(got - mean) / sd), got_sd / sd


def fit_minibatched(X, y, **options):
    """Log-loss DLM on ``logistic_regression`` with batches of 100."""
    data = {"X": X, "y": y, "batch": 100}
    options = {"num_steps": 3000, "progress_bar": False, **options}
    return autocvi.fit(logistic_regression, data, objective=autocvi.DLM(BETA), **options)


def moments(result):
    """q's means and sds of (w, b)."""
    q = result.posterior
    return (
        np.append(np.asarray(q["w"].mean), q["b"].mean),
        np.sqrt(np.append(np.asarray(q["w"].variance), q["b"].variance)),
    )
