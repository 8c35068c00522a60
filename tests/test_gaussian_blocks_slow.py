"""Gaussian blocks against the exact posterior (NUTS) on real data.

GP classification (squared-exponential kernel, one MultivariateNormal site over
training and test inputs, Bernoulli likelihood on the training part): test
log-loss in bits of autocvi's predictive must be within 0.02 bits of the NUTS
posterior predictive on the same split and hyperparameters.

* ionosphere, shipped split, (log l, log sigma) = (1, 2.5) (PG-SVI paper);
* sonar, shipped split, (log l, log sigma) = (-1, 6) (PG-SVI paper);
* scikit-learn digits 3 vs 5, pixels / 16, 50/50 split with seed 0,
  (log l, log sigma) = (1.5, 3): the best autocvi ELBO of 17 grid points,
  log l in {0.5, 1, 1.5} x log sigma in {1, 2, 3} and {1.5, 2, 2.5} x {3, 4, 5}
  (the benchmark's (1.5, 2) has ELBO -21.4 against -18.7).

GP regression with a Laplace likelihood (housing, KL-prox Table 3): autocvi's
test-point means and sds of f against NUTS, and the test mean absolute error.
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.diagnostics import summary
from numpyro.infer import MCMC, NUTS

import autocvi
from autocvi.datasets import load as load_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gp_classification import (  # noqa: E402
    gp_classifier,
    load,
    log_loss_bits,
    predictive_probability,
    squared_exponential,
)

pytestmark = [pytest.mark.slow, pytest.mark.float64]

JITTER = 1e-5  # times sigma^2 on the kernel's diagonal, as in gp_classifier


def whitened_gp(X, X_test, y, log_lengthscale=1.0, log_sd=2.5):
    """The same model with f = L v, v ~ N(0, I): the parameterisation NUTS mixes in."""
    inputs = jnp.concatenate([X, X_test])
    kernel = squared_exponential(inputs, inputs, log_lengthscale, log_sd)
    kernel = kernel + 1e-5 * jnp.exp(2 * log_sd) * jnp.eye(inputs.shape[0])
    chol = jnp.linalg.cholesky(kernel)
    v = numpyro.sample("v", dist.Normal(0.0, 1.0).expand([inputs.shape[0]]).to_event(1))
    f = numpyro.deterministic("f", chol @ v)
    with numpyro.plate("train", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=f[: X.shape[0]]), obs=y)


def test_gp_classification_ionosphere_matches_nuts_predictive():
    data, y_test = load()
    n = data["X"].shape[0]
    result = autocvi.fit(gp_classifier, data, rng_key=0, progress_bar=False)
    q = result.posterior["f"]
    p_cvi = predictive_probability(
        np.asarray(q.loc)[n:], np.diag(np.asarray(q.covariance_matrix))[n:]
    )

    mcmc = MCMC(NUTS(whitened_gp), num_warmup=400, num_samples=400, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), **data)
    f_test = np.asarray(mcmc.get_samples()["f"])[:, n:]
    p_nuts = np.mean(1.0 / (1.0 + np.exp(-f_test)), axis=0)

    loss_cvi, loss_nuts = log_loss_bits(p_cvi, y_test), log_loss_bits(p_nuts, y_test)
    print(f"test log-loss: autocvi {loss_cvi:.4f} bits, NUTS {loss_nuts:.4f} bits")
    assert abs(loss_cvi - loss_nuts) < 0.02


# ------------------------------------------------------------------ NUTS oracle
def _kernel_factors(X, X_test, log_lengthscale, log_sd):
    """Cholesky pieces of the kernel over train + test inputs (float64, gp_classifier's jitter).

    With ``L = [[L11, 0], [L21, L22]]``, ``f_train = L11 v`` and, given ``v``,
    ``f_test ~ N(L21 v, L22 L22^T)`` exactly: returns ``L11``, ``L21`` and
    ``diag(L22 L22^T)``.
    """
    inputs = np.concatenate([np.asarray(X), np.asarray(X_test)]).astype(np.float64)
    d2 = np.sum((inputs[:, None, :] - inputs[None, :, :]) ** 2, axis=-1)
    kernel = np.exp(2 * log_sd) * np.exp(-0.5 * d2 / np.exp(2 * log_lengthscale))
    kernel = kernel + JITTER * np.exp(2 * log_sd) * np.eye(inputs.shape[0])
    chol = np.linalg.cholesky(kernel)
    n = np.shape(X)[0]
    return chol[:n, :n], chol[n:, :n], np.sum(chol[n:, n:] ** 2, axis=1)


def _whitened_train_gp(chol, y, likelihood):
    """f_train = L11 v, v ~ N(0, I); the test part of f is integrated analytically."""
    v = numpyro.sample("v", dist.Normal(0.0, 1.0).expand([chol.shape[0]]).to_event(1))
    with numpyro.plate("train", chol.shape[0]):
        numpyro.sample("y", likelihood(chol @ v), obs=y)


def nuts_test_moments(
    data, likelihood, log_lengthscale, log_sd, num_warmup, num_samples, num_chains=2
):
    """Exact posterior of f at the test inputs, by NUTS on the whitened training part.

    Returns draws of ``E[f_test | f_train]`` (``(num_chains * num_samples, T)``),
    the conditional variance ``Var[f_test | f_train]`` (``(T,)``, the same for
    every draw) and NUTS diagnostics. Averaging an expectation over the Gaussian
    ``f_test | f_train`` across draws (Rao-Blackwellisation) gives the same
    posterior predictive as averaging over draws of ``f_test``, with less Monte
    Carlo noise: with sonar's sigma = e^6 the conditional sd is about 400.
    """
    L11, L21, cond_var = _kernel_factors(data["X"], data["X_test"], log_lengthscale, log_sd)
    mcmc = MCMC(
        NUTS(_whitened_train_gp),
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method="sequential",
        progress_bar=False,
    )
    chol = jnp.asarray(L11, jnp.result_type(float))
    mcmc.run(jax.random.PRNGKey(0), chol, data["y"], likelihood, extra_fields=("diverging",))
    v = np.asarray(mcmc.get_samples(group_by_chain=True)["v"], np.float64)
    cond_mean = np.einsum("tn,csn->cst", L21, v)  # (chains, draws, T)
    stats = summary({"v": v, "test_mean": cond_mean})
    diagnostics = {
        "max_r_hat": max(float(np.max(s["r_hat"])) for s in stats.values()),
        "min_n_eff": min(float(np.min(s["n_eff"])) for s in stats.values()),
        "divergences": int(np.sum(np.asarray(mcmc.get_extra_fields()["diverging"]))),
    }
    print(
        "NUTS: max r_hat {max_r_hat:.3f}, min n_eff {min_n_eff:.0f}, "
        "{divergences} divergences".format(**diagnostics)
    )
    return cond_mean.reshape(-1, cond_mean.shape[-1]), cond_var, diagnostics


def _cvi_test_marginals(result, n):
    q = result.posterior["f"]
    mean = np.asarray(q.loc, np.float64)[n:]
    var = np.diag(np.asarray(q.covariance_matrix, np.float64))[n:]
    return mean, var


def _check_gp_classification(
    data, y_test, log_lengthscale, log_sd, num_warmup, num_samples, bits=0.02, elbo=None
):
    n = data["X"].shape[0]
    hyper = {"log_lengthscale": log_lengthscale, "log_sd": log_sd}
    result = autocvi.fit(gp_classifier, {**data, **hyper}, rng_key=0, progress_bar=False)
    assert result.schedule.blocks["f"].solver == "function-space"
    p_cvi = predictive_probability(*_cvi_test_marginals(result, n))

    cond_mean, cond_var, diagnostics = nuts_test_moments(
        data, lambda f: dist.Bernoulli(logits=f), log_lengthscale, log_sd, num_warmup, num_samples
    )
    p_nuts = np.mean([predictive_probability(m, cond_var) for m in cond_mean], axis=0)

    loss_cvi, loss_nuts = log_loss_bits(p_cvi, y_test), log_loss_bits(p_nuts, y_test)
    print(
        f"autocvi: {result.num_steps} iterations, ELBO {result.elbo[-1]:.3f}; test log-loss: "
        f"autocvi {loss_cvi:.4f} bits, NUTS {loss_nuts:.4f} bits"
    )
    assert diagnostics["max_r_hat"] < 1.05  # the oracle itself has mixed
    assert abs(loss_cvi - loss_nuts) < bits
    if elbo is not None:
        assert result.converged and result.elbo[-1] > elbo


def test_gp_classification_sonar_matches_nuts_predictive():
    """Sonar's shipped split, (log l, log sigma) = (-1, 6): a kernel with sd e^6 ~ 400.

    NUTS: 0.940 bits (0.939 with 4 x 2000 draws). The Gaussian approximation's own
    optimum (ELBO -156.02, the same from an independent L-BFGS fit) has 0.918 bits,
    0.021-0.022 from the exact predictive: the limit of a Gaussian q here, not of the
    optimiser. autocvi reaches that optimum (Anderson-extrapolated steps: ~200
    iterations, ELBO -156.025), so the predictive is held to 0.03 bits and the fit to
    the optimum's ELBO. (Plain CVI steps stopped at ELBO -156.77 after 163 iterations,
    0.926 bits: inside 0.02 bits only because they had not converged.)
    """
    data, y_test = load("sonar")
    _check_gp_classification(
        data, y_test, -1.0, 6.0, num_warmup=300, num_samples=500, bits=0.03, elbo=-156.05
    )


def load_digits_3_vs_5():
    """scikit-learn's bundled digits, 3 (y = 0) vs 5 (y = 1), pixels / 16, 50/50 split (seed 0)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    keep = np.isin(digits.target, (3, 5))
    X = (digits.data[keep] / 16.0).astype(np.float32)
    y = (digits.target[keep] == 5).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[: len(y) // 2], order[len(y) // 2 :]
    data = {"X": jnp.asarray(X[train]), "X_test": jnp.asarray(X[test]), "y": jnp.asarray(y[train])}
    return data, y[test]


def test_gp_classification_digits_3_vs_5_matches_nuts_predictive():
    """182 training and 183 test images, (log l, log sigma) = (1.5, 3).

    Measured: autocvi 0.069 bits, NUTS 0.075 bits (accuracy 0.989).
    """
    data, y_test = load_digits_3_vs_5()
    _check_gp_classification(data, y_test, 1.5, 3.0, num_warmup=300, num_samples=500)


# ------------------------------------------------- GP regression, Laplace noise
# (log l, log sigma, b) on standardised data: the best Gaussian-VI ELBO of 54 grid
# points, log l in {1, 1.5, 2} x log sigma in {0, 0.5, 1} x b in {0.2, 0.3, 0.4} and
# {1.5, 2, 2.5} x {1, 1.5, 2} x {0.1, 0.15, 0.2}; each neighbour is worse by >= 7 nats.
HOUSING_HYPERPARAMETERS = {"log_lengthscale": 2.0, "log_sd": 1.0, "scale": 0.2}


def gp_laplace_regression(X, X_test, y=None, log_lengthscale=2.0, log_sd=1.0, scale=0.2):
    """f ~ GP(0, k) at train and test inputs; y_n ~ Laplace(f_n, scale) on train."""
    inputs = jnp.concatenate([X, X_test])
    kernel = squared_exponential(inputs, inputs, log_lengthscale, log_sd)
    kernel = kernel + JITTER * jnp.exp(2 * log_sd) * jnp.eye(inputs.shape[0])
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(inputs.shape[0]), kernel))
    with numpyro.plate("train", X.shape[0]):
        numpyro.sample("y", dist.Laplace(f[: X.shape[0]], scale), obs=y)


def load_housing(num_train=200, num_test=100):
    """Housing (506 x 13, no shipped split): a random 200/100 subset (seed 0);
    inputs and targets standardised with the training part's mean and sd."""
    d = load_dataset("housing")
    X, y = d["X"].astype(np.float64), np.ravel(d["y"]).astype(np.float64)
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:num_train], order[num_train : num_train + num_test]
    X = (X - X[train].mean(0)) / X[train].std(0)
    y = (y - y[train].mean()) / y[train].std()
    data = {
        "X": jnp.asarray(X[train], jnp.float32),
        "X_test": jnp.asarray(X[test], jnp.float32),
        "y": jnp.asarray(y[train], jnp.float32),
    }
    return data, y[test]


@pytest.fixture(scope="module")
def housing_fits():
    data, y_test = load_housing()
    n = data["X"].shape[0]
    hyper = HOUSING_HYPERPARAMETERS
    result = autocvi.fit(gp_laplace_regression, {**data, **hyper}, rng_key=0, progress_bar=False)
    mean_cvi, var_cvi = _cvi_test_marginals(result, n)
    scale = hyper["scale"]
    cond_mean, cond_var, diagnostics = nuts_test_moments(
        data,
        lambda f: dist.Laplace(f, scale),
        hyper["log_lengthscale"],
        hyper["log_sd"],
        num_warmup=500,
        num_samples=1500,
    )
    mean_nuts = cond_mean.mean(axis=0)
    sd_nuts = np.sqrt(cond_var + cond_mean.var(axis=0))  # law of total variance
    return {
        "result": result,
        "y_test": y_test,
        "mean_cvi": mean_cvi,
        "sd_cvi": np.sqrt(var_cvi),
        "mean_nuts": mean_nuts,
        "sd_nuts": sd_nuts,
        "diagnostics": diagnostics,
        "z": np.abs(mean_cvi - mean_nuts) / sd_nuts,
    }


def test_gp_laplace_regression_housing_matches_nuts(housing_fits):
    """Test-point means and sds of f, and the test MAE of the predictive median.

    Measured (float32): max |mean_cvi - mean_nuts| / sd_nuts = 0.23 (0.22 against
    4 x 2500 NUTS draws; 0.17 in float64), sd_cvi / sd_nuts in [0.94, 1.02], test
    MAE 0.300 (autocvi) vs 0.299 (NUTS) in standardised units. Most of the mean
    difference is Gauss-Hermite error (see the xfail test below), hence 0.3
    rather than 0.2 for the means.
    """
    h = housing_fits
    assert h["result"].schedule.blocks["f"].solver == "function-space"
    mae_cvi = float(np.mean(np.abs(h["mean_cvi"] - h["y_test"])))
    mae_nuts = float(np.mean(np.abs(h["mean_nuts"] - h["y_test"])))
    ratio = h["sd_cvi"] / h["sd_nuts"]
    print(
        f"autocvi: {h['result'].num_steps} iterations, ELBO {h['result'].elbo[-1]:.3f}; "
        f"max |mean difference| / sd_nuts {np.max(h['z']):.3f}, "
        f"sd_cvi / sd_nuts in [{ratio.min():.3f}, {ratio.max():.3f}], "
        f"test MAE autocvi {mae_cvi:.4f}, NUTS {mae_nuts:.4f}"
    )
    assert h["diagnostics"]["max_r_hat"] < 1.05
    assert np.max(h["z"]) < 0.3
    assert np.all(np.abs(ratio - 1.0) < 0.15)
    assert abs(mae_cvi - mae_nuts) < 0.02 * mae_nuts


@pytest.mark.xfail(
    strict=True,
    reason="32-node Gauss-Hermite messages of the Laplace log density -|y - f| / b (a kink) "
    "are biased: the test means of the Gaussian fixed point move by ~0.2 posterior sd (the "
    "same in an independent float64 Gauss-Hermite CVI); the same Gaussian VI with "
    "closed-form Laplace expectations is within 0.04 sd of NUTS",
)
def test_gp_laplace_regression_housing_means_within_tenth_sd(housing_fits):
    assert np.max(housing_fits["z"]) < 0.1
