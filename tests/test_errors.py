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


def _negbin_raw_covariate(x, y=None):
    """A negative-binomial GLM on a covariate in raw units (sd 1000), as a user first
    writes it: exp(a + b x) overflows at any start with b of scale 1."""
    a = numpyro.sample("a", dist.Normal(0.0, 2.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    phi = numpyro.sample("phi", dist.Exponential(1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(a + b * x), phi), obs=y)


def test_a_model_that_no_start_can_run_names_the_covariate_scale_and_the_fix():
    import numpy as np
    from numpyro.infer import init_to_value

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(0.0, 1000.0, 30), jnp.float32)
    y = jnp.asarray(rng.poisson(3.0, 30), jnp.float32)
    with pytest.raises(autocvi.ModelError) as info:
        autocvi.fit(_negbin_raw_covariate, {"x": x, "y": y}, progress_bar=False)
    message = str(info.value)
    for word in (
        "'phi'",
        "NegativeBinomial2(jnp.exp(a + b * x), phi)",
        "covariate",
        "init_to_value",
    ):
        assert word in message, (word, message)
    # the fix it names runs
    start = init_to_value(values={"a": 1.0, "b": 0.0, "phi": 1.0})
    result = autocvi.fit(
        _negbin_raw_covariate, {"x": x, "y": y}, init_strategy=start, progress_bar=False
    )
    assert np.isfinite(result.elbo_final)


def _hmm_with_states_in_a_scan(y):
    """A 2-state Gaussian HMM as NumPyro's examples write it: a Categorical state per
    step of a scan, its transition row read from the previous state."""
    from numpyro.contrib.control_flow import scan

    p_stay = numpyro.sample("p_stay", dist.Beta(5.0 * jnp.ones(2), jnp.ones(2)).to_event(1))
    mu = numpyro.sample("mu", dist.Normal(jnp.array([-1.0, 1.0]), 1.0).to_event(1))
    trans = jnp.stack(
        [jnp.stack([p_stay[0], 1 - p_stay[0]]), jnp.stack([1 - p_stay[1], p_stay[1]])]
    )

    def step(z_prev, y_t):
        z = numpyro.sample("z", dist.Categorical(trans[z_prev]))
        numpyro.sample("y", dist.Normal(mu[z], 0.7), obs=y_t)
        return z, None

    scan(step, 0, y)


def test_a_markov_chain_of_discrete_states_names_the_forward_algorithm():
    y = jnp.asarray([-0.8, -0.9, 0.7, 0.9, 1.1, -0.6, -0.7, 0.8] * 3, jnp.float32)
    with pytest.raises(NotImplementedError) as info:
        autocvi.fit(_hmm_with_states_in_a_scan, {"y": y}, progress_bar=False)
    for word in ("'z'", "Markov chain", "forward algorithm", "numpyro.factor"):
        assert word in str(info.value), (word, str(info.value))
