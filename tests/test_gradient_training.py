"""``fit(..., optimizer=optax.adam(...))``: q trained by gradient steps on the objective
(autocvi.infer.gradient_training; issue 16, "an Adam option that reproduces the paper's
training").

Oracles: a hand-written Adam on the closed-form log-loss DLM objective in the DLM paper's
whitened parameterisation (Wei, Sheth & Khardon 2021, Sec. 2: ``sum_n log N(y_n | mu_n,
v_n + s^2) / beta - KL``), step by step; the closed-form posterior of a Bayesian linear
regression for the ELBO."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest

import autocvi

NOISE = 0.3


def gp_regression(K, y=None):
    """A GP regression as a user writes it: the latent function with its kernel prior."""
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(K.shape[0]), K))
    with numpyro.plate("data", K.shape[0]):
        numpyro.sample("y", dist.Normal(f, NOISE), obs=y)


def gp_data(n=25):
    rng = np.random.RandomState(1)
    x = np.sort(rng.uniform(-3, 3, n))
    y = np.sin(x) + NOISE * rng.randn(n)
    y[3] += 3.0  # an outlier: the DLM optimum has a site of negative precision there
    K = np.exp(-0.5 * (x[:, None] - x[None]) ** 2) + 1e-6 * np.eye(n)
    return K, y


def hand_written_adam(K, y, beta, lr, steps):
    """The paper's training, written out: Adam on (m, L) of q(v) = N(m, L L^T),
    ``f = chol(K) v``, from autocvi's documented start (the prior's mean, one more unit
    of precision than the prior: N(0, I / 2) in v)."""
    n = len(y)
    LK = np.linalg.cholesky(K)

    def unpack(t):
        return t["m"], jnp.tril(t["L"], -1) + jnp.diag(jnp.exp(jnp.diag(t["L"])))

    def objective(t):
        m, L = unpack(t)
        mu = LK @ m
        var = jnp.sum((LK @ L) ** 2, -1) + NOISE**2
        kl = 0.5 * (jnp.sum(L**2) + m @ m - n - 2 * jnp.sum(jnp.log(jnp.diag(L))))
        return jnp.sum(jax.scipy.stats.norm.logpdf(y, mu, jnp.sqrt(var))) / beta - kl

    opt = optax.adam(lr)
    t = {"m": jnp.zeros(n), "L": jnp.diag(jnp.full(n, np.log(np.sqrt(0.5))))}
    state = opt.init(t)

    @jax.jit
    def step(t, state):
        g = jax.grad(objective)(t)
        u, state = opt.update(jax.tree_util.tree_map(jnp.negative, g), state, t)
        return optax.apply_updates(t, u), state

    for _ in range(steps):
        t, state = step(t, state)
    m, L = unpack(t)
    return np.asarray(LK @ m), np.asarray(LK @ L @ L.T @ LK.T), float(objective(t))


@pytest.mark.float64
def test_adam_follows_the_papers_training_step_by_step():
    K, y = gp_data()
    beta, lr, steps = 0.2, 0.02, 400
    result = autocvi.fit(
        gp_regression,
        {"K": K, "y": y},
        objective=autocvi.DLM(beta),
        optimizer=optax.adam(lr),
        num_steps=steps,
        tol=0,
        progress_bar=False,
    )
    mean, cov, value = hand_written_adam(K, y, beta, lr, steps)
    q = result.posterior["f"]
    np.testing.assert_allclose(np.asarray(q.mean), mean, atol=1e-7)
    np.testing.assert_allclose(np.asarray(q.covariance_matrix), cov, atol=1e-5)
    # the objective is the same function: the quadrature's log E_q[p] is exact here
    assert result.elbo_final == pytest.approx(value, abs=1e-4)
    assert result.elbo.shape == (steps,)


@pytest.mark.float64
def test_a_resumed_gradient_fit_continues_where_it_stopped():
    K, y = gp_data()
    kwargs = dict(objective=autocvi.DLM(0.2), tol=0, progress_bar=False)
    data = {"K": K, "y": y}
    whole = autocvi.fit(gp_regression, data, optimizer=optax.adam(0.02), num_steps=300, **kwargs)
    first = autocvi.fit(gp_regression, data, optimizer=optax.adam(0.02), num_steps=120, **kwargs)
    rest = autocvi.fit(
        gp_regression,
        data,
        optimizer=optax.adam(0.02),
        num_steps=180,
        init_state=first.state,
        **kwargs,
    )
    np.testing.assert_allclose(
        np.asarray(rest.posterior["f"].mean), np.asarray(whole.posterior["f"].mean), atol=1e-10
    )
    assert int(rest.state.iteration) == 300


def linear_regression(X, y=None):
    with numpyro.plate("features", X.shape[1]):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ w + b, 0.5), obs=y)


@pytest.mark.parametrize("x64", [False, pytest.param(True, marks=pytest.mark.float64)])
def test_adam_on_the_elbo_reaches_the_closed_form_posterior(x64, precision):
    """float32 (what users get) and float64 both: Bayesian linear regression with a
    feature plate and a separate intercept; the exact posterior is Gaussian, so the
    full-rank q Adam trains is the posterior at the ELBO's optimum."""
    rng = np.random.RandomState(0)
    X = rng.randn(100, 3)
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.3 + 0.5 * rng.randn(100)
    result = autocvi.fit(
        linear_regression,
        {"X": X, "y": y},
        optimizer=optax.adam(optax.exponential_decay(0.05, 500, 0.5)),
        num_steps=4000,
        progress_bar=False,
    )
    Z = np.column_stack([X, np.ones(len(y))])
    cov = np.linalg.inv(np.eye(4) + Z.T @ Z / 0.25)
    mean = cov @ (Z.T @ y / 0.25)
    sd = np.sqrt(np.diag(cov))
    got = np.append(np.asarray(result.posterior["w"].mean), result.posterior["b"].mean)
    got_sd = np.append(
        np.sqrt(np.asarray(result.posterior["w"].variance)), np.sqrt(result.posterior["b"].variance)
    )
    np.testing.assert_allclose(got, mean, atol=0.02 * sd.min())
    np.testing.assert_allclose(got_sd, sd, rtol=0.02)
    assert result.converged
    assert result.posterior["b"].mean.dtype == precision


def test_gradient_training_refuses_what_it_cannot_train_by_name():
    def scale_model(y=None):
        sigma = numpyro.sample("sigma", dist.Gamma(2.0, 2.0))
        with numpyro.plate("data", 20):
            numpyro.sample("y", dist.Normal(0.0, 1.0 / jnp.sqrt(sigma)), obs=y)

    y = np.random.RandomState(0).randn(20)
    adam = optax.adam(0.01)
    with pytest.raises(NotImplementedError, match="'sigma' has a Gamma q"):
        autocvi.fit(scale_model, {"y": y}, optimizer=adam, num_steps=10, progress_bar=False)
    K, yk = gp_data()
    with pytest.raises(ValueError, match="pass num_steps"):
        autocvi.fit(gp_regression, {"K": K, "y": yk}, optimizer=adam, progress_bar=False)
    with pytest.raises(NotImplementedError, match="sampling estimate"):
        autocvi.fit(
            gp_regression,
            {"K": K, "y": yk},
            objective=autocvi.DLM(1.0, gradient="bmc", num_samples=10),
            optimizer=adam,
            num_steps=10,
            progress_bar=False,
        )

    def learned_noise(K, y=None):
        s = numpyro.param("s", 0.5, constraint=dist.constraints.positive)
        f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(K.shape[0]), K))
        with numpyro.plate("data", K.shape[0]):
            numpyro.sample("y", dist.Normal(f, s), obs=y)

    with pytest.raises(NotImplementedError, match="learn_params=False"):
        autocvi.fit(learned_noise, {"K": K, "y": yk}, optimizer=adam, num_steps=10)
    held = autocvi.fit(
        learned_noise,
        {"K": K, "y": yk},
        optimizer=adam,
        num_steps=10,
        learn_params=False,
        progress_bar=False,
        check=False,
    )
    assert held.params["s"] == pytest.approx(0.5)
