"""Data-driven starts for mixture assignments (k-means++ responsibilities).

Oracle: the clusters the data were simulated from. Six well-separated 2-D
clusters; with Dirichlet(1) random responsibilities, single starts with seeds
4, 6 and 11 (of 0-11) ended 38-157 nats below the others with two clusters
merged. From the k-means start every single start finds the six true centres.
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import autocvi
from autocvi.engine.init import _kmeans_pp_responsibilities, _observed_rows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo.models import isotropic_gaussian_mixture  # noqa: E402

K = 6
_RS = np.random.RandomState(0)
CENTRES = _RS.uniform(-6, 6, size=(K, 2))
LABELS = _RS.choice(K, 600)
Y = CENTRES[LABELS] + 0.5 * _RS.randn(600, 2)


# the zoo's iris mixture, with six components and wider location priors
mixture = isotropic_gaussian_mixture(K=K, loc_scale=5.0)


def _matched_error(found, truth):
    """Largest distance from a true centre to its nearest found centre, and whether the
    matching is one to one."""
    d = np.linalg.norm(np.asarray(found)[:, None] - truth[None], axis=-1)
    return float(np.max(np.min(d, axis=0))), len(set(np.argmin(d, axis=0))) == len(truth)


def test_kmeans_responsibilities_recover_the_simulated_clusters():
    log_r = _kmeans_pp_responsibilities(jnp.asarray(Y, jnp.float32), K, jax.random.PRNGKey(4))
    r = np.exp(np.asarray(log_r))
    np.testing.assert_allclose(r.sum(-1), 1.0, rtol=1e-5)
    assert r.min() >= 0.1 / K - 1e-6  # no component starts empty
    # every simulated cluster is one start component (a contingency table with one
    # dominant entry per row)
    table = np.zeros((K, K))
    np.add.at(table, (LABELS, np.argmax(r, -1)), 1.0)
    assert np.all(table.max(1) >= 0.9 * table.sum(1))  # the clusters overlap a little
    assert len(set(np.argmax(table, 1))) == K


@pytest.mark.parametrize("seed", [pytest.param(4, marks=pytest.mark.slow), 6, 11])
@pytest.mark.slow  # default run under budget (session 22)
def test_every_single_start_finds_the_six_clusters(seed):
    r = autocvi.fit(mixture, {"y": jnp.asarray(Y, jnp.float32)}, num_restarts=1, rng_key=seed)
    err, one_to_one = _matched_error(r.posterior["locs"].mean, CENTRES)
    assert one_to_one and err < 0.15, (err, one_to_one)
    assert r.converged


def test_rows_come_only_from_continuous_observations():
    """Completeness and soundness of the data-driven start: a Gaussian mixture's
    observations give one row per element; a categorical observation (a topic model's
    words) gives none, and the start stays random."""
    y = jnp.asarray(Y, jnp.float32)
    sched = autocvi.plan(mixture, {"y": y})
    values = {**sched.graph.example_values, **sched.params}
    rows = _observed_rows(sched, "z", values)
    np.testing.assert_allclose(np.asarray(rows), Y, rtol=1e-5, atol=1e-5)

    def topics(words):
        theta = numpyro.sample("theta", dist.Dirichlet(jnp.ones(3)))
        with numpyro.plate("topics", 3):
            phi = numpyro.sample("phi", dist.Dirichlet(jnp.ones(5)))
        with numpyro.plate("words", words.shape[0]):
            z = numpyro.sample("z", dist.Categorical(theta))
            numpyro.sample("w", dist.Categorical(phi[z]), obs=words)

    words = jnp.asarray(_RS.choice(5, 40))
    sched = autocvi.plan(topics, {"words": words})
    values = {**sched.graph.example_values, **sched.params}
    assert _observed_rows(sched, "z", values) is None
