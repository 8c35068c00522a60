"""The final ELBO of a minibatched fit is an unbiased estimate of the full-data ELBO of q.

Oracle: the full-data ELBO of the fitted q(mu) = N(m, s^2) in closed form (a Normal mean
with known noise and a Normal prior), against ``result.elbo_final`` (64 estimates on
fresh batches drawn with replacement, ``autocvi.engine.step``'s ``plate_indices``),
within four of its standard errors (the batches' scatter, from the data).
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import autocvi

N, B, PRIOR_SD = 400, 20, 10.0


def model(y, batch_size=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    with numpyro.plate("data", y.shape[0], subsample_size=batch_size) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


@pytest.mark.parametrize(
    "precision", [pytest.param("float64", marks=pytest.mark.float64), "float32"]
)
def test_final_elbo_of_a_minibatched_fit_estimates_the_full_data_elbo(precision):
    y = np.random.default_rng(0).normal(2.0, 1.0, N)
    result = autocvi.fit(model, {"y": jnp.asarray(y), "batch_size": B}, progress_bar=False)
    q = result.posterior["mu"]
    m, s2 = float(q.loc), float(q.scale) ** 2
    assert jnp.asarray(q.loc).dtype == jnp.dtype(precision)
    # per observation: E_q log N(y_i | mu, 1)
    terms = -0.5 * np.log(2 * np.pi) - 0.5 * ((y - m) ** 2 + s2)
    prior = -0.5 * np.log(2 * np.pi * PRIOR_SD**2) - (m**2 + s2) / (2 * PRIOR_SD**2)
    entropy = 0.5 * np.log(2 * np.pi * np.e * s2)
    exact = terms.sum() + prior + entropy
    # 64 estimates, each N / B times a batch's sum of B terms drawn with replacement
    se = N * terms.std() / np.sqrt(B) / np.sqrt(64)
    # 4 se is about 30 nats here; a batch not scaled by N / B is off by about 540
    assert abs(result.elbo_final - exact) < 4 * se
