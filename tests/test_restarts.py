"""``fit``'s restarts run as one ``jax.vmap``: the same fits as one at a time.

Oracle: single-restart fits (``num_restarts=1``) with each restart's key (restart 0
``rng_key``, restart ``k`` ``fold_in(rng_key, k)``), which never go through the
batched path. The vmapped restarts must give every restart's final ELBO (and the kept
restart's posterior) up to floating-point noise, and keep the best.

Runs in float64 (the ``float64`` marker; ``tests/conftest.py`` decides precision).
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import autocvi

pytestmark = pytest.mark.float64

K = 3
# Four well-separated 1-D clusters for three components: some cluster has to share a
# component, and restarts from different keys end at different fixed points (ELBOs
# ~6 nats apart), so keeping the wrong restart shows.
_RS = np.random.RandomState(0)
CENTRES = np.array([-6.0, -2.0, 2.0, 6.0])
Y = CENTRES[_RS.choice(4, 120)] + 0.5 * _RS.randn(120)
# With this seed restart 0 ends ~6 nats below restarts 1 and 2.
SEED = 1


def mixture(y):
    with numpyro.plate("components", K):
        mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    with numpyro.plate("data", y.shape[0]):
        z = numpyro.sample("z", dist.Categorical(probs=jnp.ones(K) / K))
        numpyro.sample("y", dist.Normal(mu[z], 0.5), obs=y)


def restart_key(seed, k):
    key = jax.random.PRNGKey(seed)
    return key if k == 0 else jax.random.fold_in(key, k)


def quiet_fit(model, data, **kw):
    return autocvi.fit(model, data, progress_bar=False, check=False, **kw)


@pytest.fixture(scope="module")
def mixture_fits():
    """The vmapped fit (3 restarts, the default for discrete latents) and its oracle:
    one single-restart fit per restart key."""
    data = {"y": jnp.asarray(Y)}
    batched = quiet_fit(mixture, data, rng_key=SEED, batch_restarts=True)
    singles = [
        quiet_fit(mixture, data, num_restarts=1, rng_key=restart_key(SEED, k)) for k in range(K)
    ]
    return batched, singles


def test_vmapped_restarts_give_every_restarts_elbo(mixture_fits):
    batched, singles = mixture_fits
    oracle = np.asarray([s.elbo_final for s in singles])
    assert batched.restart_elbos.shape == (3,)
    np.testing.assert_allclose(batched.restart_elbos, oracle, rtol=1e-4)
    # the restarts really end apart (else keeping the best would be vacuous)
    assert np.ptp(oracle) > 1.0


def test_vmapped_restarts_keep_the_best_restarts_posterior(mixture_fits):
    batched, singles = mixture_fits
    best = int(np.argmax(batched.restart_elbos))
    assert batched.elbo_final == batched.restart_elbos[best]
    assert batched.elbo_final > min(batched.restart_elbos) + 1.0
    # the kept state is restart `best`'s (its own labelling of the components)
    oracle = singles[best]
    np.testing.assert_allclose(
        batched.posterior["mu"].mean, oracle.posterior["mu"].mean, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(batched.elbo, oracle.elbo, rtol=1e-6)
    assert batched.converged and batched.num_steps == oracle.num_steps


def logistic(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def logistic_data():
    rs = np.random.RandomState(1)
    X = rs.randn(60, 2)
    y = (rs.rand(60) < 1.0 / (1.0 + np.exp(-X @ np.array([1.0, -0.5])))).astype(float)
    return {"X": jnp.asarray(X), "y": jnp.asarray(y)}


def test_vmapped_restarts_of_a_model_without_discrete_latents():
    """Monte Carlo messages (``use_quadrature=False``): the vmapped loop with its
    convergence hold, iterate averaging and 64-draw final ELBO, asked for explicitly."""
    result = quiet_fit(
        logistic,
        logistic_data(),
        num_restarts=2,
        rng_key=0,
        use_quadrature=False,
        batch_restarts=True,
    )
    assert result.restart_elbos.shape == (2,)
    assert np.all(np.isfinite(result.restart_elbos))
    assert result.elbo_final == result.restart_elbos.max()
    assert result.converged
    assert np.all(np.isfinite(np.asarray(result.posterior["w"].mean)))


@pytest.mark.slow  # two more compilations (the single-restart programs): ~12 s
def test_vmapped_monte_carlo_restarts_match_single_fits():
    """The Monte Carlo path against its oracle: restart k's final ELBO (after the
    averaging, from its own key's draws) and the kept posterior, as single fits give them."""
    data = logistic_data()
    batched = quiet_fit(
        logistic, data, num_restarts=2, rng_key=0, use_quadrature=False, batch_restarts=True
    )
    singles = [
        quiet_fit(logistic, data, num_restarts=1, rng_key=restart_key(0, k), use_quadrature=False)
        for k in range(2)
    ]
    np.testing.assert_allclose(batched.restart_elbos, [s.elbo_final for s in singles], rtol=1e-4)
    best = int(np.argmax(batched.restart_elbos))
    np.testing.assert_allclose(
        batched.posterior["w"].mean, singles[best].posterior["w"].mean, rtol=1e-4, atol=1e-6
    )
    assert batched.num_steps == singles[best].num_steps


def test_restarts_fall_back_to_the_loop_without_a_batching_rule(monkeypatch, mixture_fits):
    """A program JAX cannot vmap (a primitive without a batching rule raises
    NotImplementedError while it is traced): the restarts run one after another, with
    the same results."""
    import importlib

    fit_module = importlib.import_module("autocvi.infer.fit")

    def no_batching_rule(*args, **kwargs):
        raise NotImplementedError("Batching rule for 'custom' not implemented")

    monkeypatch.setattr(fit_module, "run_restarts_loop", no_batching_rule)
    result = quiet_fit(mixture, {"y": jnp.asarray(Y)}, rng_key=SEED, batch_restarts=True)
    _, singles = mixture_fits
    np.testing.assert_allclose(result.restart_elbos, [s.elbo_final for s in singles], rtol=1e-10)


def test_restarts_run_one_after_another_by_default_on_cpu(monkeypatch, mixture_fits):
    """On CPU the vmapped restarts were slower (fit's ``batch_restarts``): the default
    runs them one after another, with the same restarts' ELBOs."""
    import importlib

    fit_module = importlib.import_module("autocvi.infer.fit")
    assert jax.default_backend() == "cpu"

    def must_not_run(*args, **kwargs):
        raise AssertionError("the restarts were vmapped on CPU by default")

    monkeypatch.setattr(fit_module, "run_restarts_loop", must_not_run)
    result = quiet_fit(mixture, {"y": jnp.asarray(Y)}, rng_key=SEED)
    _, singles = mixture_fits
    np.testing.assert_allclose(result.restart_elbos, [s.elbo_final for s in singles], rtol=1e-10)
