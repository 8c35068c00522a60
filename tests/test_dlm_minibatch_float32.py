"""Log-loss DLM with minibatches in float32, what users run (tests/test_dlm_minibatch.py
has the model, the data and the oracle, which is computed here in float64)."""

import jax
import jax.numpy as jnp
import numpy as np
from test_dlm_minibatch import data, dlm_optimum, fit_minibatched, moments


def test_minibatched_dlm_reaches_the_full_data_optimum_in_float32():
    with jax.enable_x64(True):
        X, y = data()
        mean, cov = dlm_optimum(X, y)
    sd = np.sqrt(np.diag(cov))
    X, y = (jnp.asarray(np.asarray(a), jnp.float32) for a in (X, y))
    result = fit_minibatched(X, y)
    got, got_sd = moments(result)
    assert got.dtype == np.float32
    assert result.converged
    # measured: 0.001 sd and 0.07% in 88 iterations
    assert np.max(np.abs(got - mean) / sd) < 0.02
    np.testing.assert_allclose(got_sd, sd, rtol=0.01)
