"""Every error a user meets names the site, the distribution and what to change.

Issue 13: errors that end in an empty text (``NotImplementedError``) or in an
internal name give a user nothing to act on.
"""

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints

import autocvi


def poisson_latent(y=None):
    n = numpyro.sample("n", dist.Poisson(5.0))
    numpyro.sample("y", dist.Normal(n, 1.0), obs=y)


def binomial_latent(y=None):
    k = numpyro.sample("k", dist.Binomial(10, 0.3))
    numpyro.sample("y", dist.Normal(k, 1.0), obs=y)


def unused_flat_prior(y=None):
    numpyro.sample("free", dist.ImproperUniform(constraints.real, (), ()))
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def model_that_raises(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    raise NotImplementedError  # empty message, as ImproperUniform.sample raises
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.mark.parametrize(
    "model, words",
    [
        (poisson_latent, ["'n'", "Poisson", "Categorical"]),
        (binomial_latent, ["'k'", "Binomial", "Categorical"]),
        (unused_flat_prior, ["'free'", "ImproperUniform", "proper prior"]),
        (model_that_raises, ["NotImplementedError", "'mu'", "no message"]),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_errors_name_the_site_and_the_fix(model, words):
    with pytest.raises(autocvi.ModelError) as info:
        autocvi.fit(model, {"y": 3.0}, progress_bar=False)
    message = str(info.value)
    for word in words:
        assert word in message, (word, message)


def test_numpy_data_indexed_by_subsample_indices_names_the_fix():
    """NumPy data indexed with a subsampled plate's traced indices (X[idx]): a ModelError
    that names the factor and the fix, not JAX's TracerArrayConversionError."""
    import numpy as np
    import numpyro
    import numpyro.distributions as dist

    rng = np.random.RandomState(0)
    X, y = rng.normal(size=(200, 3)), (rng.uniform(size=200) < 0.5).astype(float)

    def model(X, y=None):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([3]).to_event(1))
        with numpyro.plate("N", X.shape[0], subsample_size=50) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])

    with pytest.raises(
        autocvi.ModelError, match=r"cannot be traced.*X\[idx\] @ w.*jnp.asarray\(X\)"
    ):
        autocvi.plan(model, {"X": X, "y": y})
    # The fix it names works.
    autocvi.plan(model, {"X": jnp.asarray(X), "y": jnp.asarray(y)})
