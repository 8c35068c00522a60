"""GP classification with autocvi against the exact posterior predictive (NUTS).

Ionosphere with the PG-SVI paper's kernel hyperparameters (log l, log sigma) =
(1, 2.5) and the data's shipped train/test split. Test log-loss in bits of
autocvi's predictive must be within 0.02 bits of the NUTS predictive.
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS

import autocvi

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gp_classification import (  # noqa: E402
    gp_classifier,
    load,
    log_loss_bits,
    predictive_probability,
    squared_exponential,
)

pytestmark = pytest.mark.slow


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
