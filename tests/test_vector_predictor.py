"""Vector linear predictors (issue #15): a factor that reads a Gaussian through one
K-vector per element (a softmax's logits) gets a deterministic K-dim cubature message.

Oracles: closed-form Gaussian moments of polynomials (the rule's exactness degree), a
product Gauss-Hermite rule for K = 2, 3, the Monte Carlo-message fit of the same model
(use_quadrature=False) and NUTS."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer.util import log_density

import autocvi
from autocvi.analysis.expectations import spherical_radial
from autocvi.analysis.linear_predictor import find_linear_predictor, find_vector_predictor

# ---------------------------------------------------------------- the split


def _softmax_factor(X, y):
    def fn(values):
        return dist.Categorical(logits=X @ values["W"]).log_prob(y)

    return fn


def test_vector_predictor_found_on_softmax_logits():
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.normal(size=(7, 4)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, 7))
    W = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
    fn = _softmax_factor(X, y)
    assert find_linear_predictor(fn, {"W": W}, "W") is None  # no scalar predictor
    lp = find_vector_predictor(fn, {"W": W}, "W")
    assert lp is not None and lp.vector_size == 3
    np.testing.assert_allclose(lp.eta_fn({"W": W}), X @ W, rtol=1e-6)
    np.testing.assert_allclose(lp.rest_fn(lp.eta_fn({"W": W}), {"W": W}), fn({"W": W}), rtol=1e-6)
    # the rest never reads W
    np.testing.assert_allclose(lp.rest_fn(X @ W, {}), fn({"W": W}), rtol=1e-6)


def test_vector_predictor_refused_where_rows_mix():
    rng = np.random.default_rng(1)
    X = jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)
    W = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)

    def over_observations(values):  # normalised over the data axis: rows mix
        return jax.nn.log_softmax(X @ values["W"], axis=0)[:, 0]

    def summed(values):  # one output element reads every row
        eta = X @ values["W"]
        return jnp.broadcast_to(jnp.sum(eta**2), (6,))

    def two_predictors(values):  # not affine: a product of two rows' logits
        eta = X @ values["W"]
        return eta[:, 0] * jnp.roll(eta[:, 1], 1)

    for fn in (over_observations, summed, two_predictors):
        assert find_vector_predictor(fn, {"W": W}, "W") is None


# ---------------------------------------------------------------- the rule


def _random_gaussian(rng, n, k, scale=1.0):
    m = rng.normal(size=(n, k))
    b = rng.normal(size=(n, k, k))
    return m, scale * (b @ np.swapaxes(b, 1, 2) / k + 0.1 * np.eye(k))


@pytest.mark.float64
def test_cubature_exact_for_cubic_polynomials():
    """Degree 3: E of a cubic, E[grad] (degree 2) and E[hess] (degree 1) are exact."""
    rng = np.random.default_rng(2)
    n, k = 5, 4
    m, v = _random_gaussian(rng, n, k)
    a = rng.normal(size=(n, k))
    q = rng.normal(size=(n, k, k))
    q = 0.5 * (q + np.swapaxes(q, 1, 2))
    c = rng.normal(size=(n, k))

    def rest(eta):
        return (
            jnp.sum(a * eta, -1) + jnp.einsum("ni,nij,nj->n", eta, q, eta) + jnp.sum(c * eta**3, -1)
        )

    e, g, h = spherical_radial(rest, jnp.asarray(m), jnp.asarray(v))
    dv = np.diagonal(v, axis1=1, axis2=2)
    e_true = (
        np.sum(a * m, -1)
        + np.einsum("nij,nij->n", q, v)
        + np.einsum("ni,nij,nj->n", m, q, m)
        + np.sum(c * (m**3 + 3 * m * dv), -1)
    )
    g_true = a + 2 * np.einsum("nij,nj->ni", q, m) + 3 * c * (m**2 + dv)
    h_true = 2 * q + 6 * np.einsum("ni,ij->nij", c * m, np.eye(k))
    np.testing.assert_allclose(e, e_true, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(g, g_true, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h, h_true, rtol=1e-10, atol=1e-10)


def _product_gauss_hermite(fn, m, v, order=24):
    """E[fn(eta)] per row under N(m_n, v_n) by a product Gauss-Hermite rule."""
    x, w = np.polynomial.hermite_e.hermegauss(order)
    w = w / np.sqrt(2 * np.pi)
    k = m.shape[-1]
    pts = np.array(list(itertools.product(x, repeat=k)))  # (P, K)
    wts = np.prod(np.array(list(itertools.product(w, repeat=k))), -1)
    chol = np.linalg.cholesky(v)
    eta = m[None] + np.einsum("nij,pj->pni", chol, pts)  # (P, N, K)
    vals = np.asarray(jax.vmap(fn)(jnp.asarray(eta)))
    return np.tensordot(wts, vals, 1)


@pytest.mark.float64
@pytest.mark.parametrize("k", [2, 3])
def test_cubature_softmax_against_product_gauss_hermite(k):
    """E[log softmax_y], E[grad], E[hess] against a 24^K-point product rule: the
    third-degree rule's error is fourth order in the predictor's sd, so it is small at
    sd ~0.3 and shrinks ~16x when the covariance is quartered."""
    rng = np.random.default_rng(3 + k)
    n = 6
    y = jnp.asarray(rng.integers(0, k, n))
    m, v = _random_gaussian(rng, n, k, scale=0.1)

    def rest(eta):
        return jax.nn.log_softmax(eta, -1)[jnp.arange(n), y]

    def grad(eta):
        return jax.grad(lambda e: jnp.sum(rest(e)))(eta)

    def hess(eta):
        return jax.vmap(jax.hessian(lambda e, yy: jax.nn.log_softmax(e)[yy]))(eta, y)

    errs = []
    for scale in (1.0, 0.25):
        vv = v * scale
        e, g, h = spherical_radial(rest, jnp.asarray(m), jnp.asarray(vv))
        ref = [_product_gauss_hermite(f, m, vv) for f in (rest, grad, hess)]
        errs.append([np.max(np.abs(np.asarray(a) - r)) for a, r in zip((e, g, h), ref)])
    errs = np.array(errs)
    assert np.all(errs[0] < 5e-3), errs
    assert np.all(errs[1] < errs[0] / 6 + 1e-12), errs


# ---------------------------------------------------------------- a fit


def _softmax_data(seed=0, n=150, d=3, k=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    W = rng.normal(size=(d, k)) * 1.0
    logits = X.astype(np.float64) @ W
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = np.array([rng.choice(k, p=pi) for pi in p])
    return jnp.asarray(X), jnp.asarray(y, jnp.int32)


def softmax_regression(X, y=None, K=3):
    W = numpyro.sample("W", dist.Normal(0.0, 1.0).expand([X.shape[1], K]).to_event(2))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Categorical(logits=X @ W), obs=y)


def _elbo(q, data, draws=20000, seed=11):
    """E_q[log p(y, W) - log q(W)] by plain Monte Carlo from q (the same for both fits)."""
    w = q.sample(jax.random.PRNGKey(seed), (draws,))

    def log_joint(wi):
        return log_density(softmax_regression, (), data, {"W": wi})[0]

    lj = jax.vmap(log_joint)(w)
    vals = lj - q.log_prob(w)
    return float(jnp.mean(vals)), float(jnp.std(vals) / np.sqrt(draws))


def test_plan_shows_cubature_message():
    X, y = _softmax_data()
    text = str(autocvi.plan(softmax_regression, {"X": X, "y": y}))
    assert "y (cubature)" in text
    text = str(autocvi.plan(softmax_regression, {"X": X, "y": y}, use_quadrature=False))
    assert "y (monte-carlo)" in text


def _gp_marginal(X, y=None):
    amplitude = numpyro.sample("amplitude", dist.LogNormal(0.0, 1.0))
    noise = numpyro.sample("noise", dist.LogNormal(-1.0, 1.0))
    K = amplitude * jnp.exp(-0.5 * (X[:, None] - X[None]) ** 2) + noise * jnp.eye(X.shape[0])
    numpyro.sample("y", dist.MultivariateNormal(jnp.zeros(X.shape[0]), K), obs=y)


def _ordered_mixture(y=None):
    weights = numpyro.sample("weights", dist.Dirichlet(jnp.ones(3)))
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0).expand([3]).to_event(1))
    with numpyro.plate("data", y.shape[0]):
        mix = dist.MixtureSameFamily(dist.Categorical(weights), dist.Normal(mu, 1.0))
        numpyro.sample("y", mix, obs=y)


@pytest.mark.slow  # default run under budget (session 22)
def test_no_cubature_for_one_row_factors():
    """A factor with one output element (a GP's marginal likelihood in its kernel
    parameters, a Dirichlet prior, a joint group's log|J|) splits trivially, with the
    latent's own coordinates as the predictor; the third-degree rule must not replace
    its Monte Carlo or Gauss-Hermite message there (it fired on seven zoo models)."""
    X = jnp.linspace(-2.0, 2.0, 12)
    y = jnp.sin(X)
    text = str(autocvi.plan(_gp_marginal, {"X": X, "y": y}))
    assert "cubature" not in text, text
    ys = jnp.concatenate([jnp.linspace(-3.0, -2.0, 10), jnp.linspace(2.0, 3.0, 10)])
    text = str(autocvi.plan(_ordered_mixture, {"y": ys}))
    assert "cubature" not in text, text


@pytest.mark.parametrize(
    "precision_",
    ["float32", pytest.param("float64", marks=[pytest.mark.float64, pytest.mark.slow])],
)
@pytest.mark.slow  # default run under budget (session 22)
def test_softmax_fit_elbo_at_least_monte_carlo(precision_):
    X, y = _softmax_data()
    data = {"X": X, "y": y}
    new = autocvi.fit(softmax_regression, data, num_steps=300, progress_bar=False)
    old = autocvi.fit(
        softmax_regression, data, num_steps=300, progress_bar=False, use_quadrature=False
    )
    e_new, se_new = _elbo(new.posterior["W"], data)
    e_old, se_old = _elbo(old.posterior["W"], data)
    assert np.isfinite(e_new)
    assert e_new >= e_old - 0.1 - 3 * np.hypot(se_new, se_old), (e_new, e_old)
    assert new.num_steps < old.num_steps or new.converged


@pytest.mark.slow
def test_softmax_fit_close_to_nuts():
    X, y = _softmax_data()
    data = {"X": X, "y": y}
    q = autocvi.fit(softmax_regression, data, num_steps=300, progress_bar=False).posterior["W"]
    mcmc = numpyro.infer.MCMC(
        numpyro.infer.NUTS(softmax_regression), num_warmup=500, num_samples=2000, progress_bar=False
    )
    mcmc.run(jax.random.PRNGKey(0), **data)
    ws = np.asarray(mcmc.get_samples()["W"])
    mean, sd = ws.mean(0), ws.std(0)
    # The softmax is invariant to adding a constant per feature across classes: the prior
    # fixes that direction, which q and NUTS both see; the bar is the zoo's (0.1 sd) plus
    # the Gaussian approximation's own error on this mildly skewed posterior.
    z = np.abs(np.asarray(q.mean) - mean) / sd
    assert np.max(z) < 0.25, z
    ratio = np.sqrt(np.asarray(q.variance)) / sd
    assert np.all((ratio > 0.8) & (ratio < 1.2)), ratio


@pytest.mark.slow
def test_minibatch_site_memory_holds_vector_sites():
    """With minibatches the message is held as K-vector / K x K sites per element and the
    fit reaches the full-batch q (SAG at its fixed point)."""
    X, y = _softmax_data(n=120)

    def model(X, y=None, B=None):
        W = numpyro.sample("W", dist.Normal(0.0, 1.0).expand([X.shape[1], 3]).to_event(2))
        with numpyro.plate("n", X.shape[0], subsample_size=B) as idx:
            numpyro.sample("y", dist.Categorical(logits=X[idx] @ W), obs=y[idx])

    schedule = autocvi.plan(model, {"X": X, "y": y, "B": 30})
    (mem,) = schedule.site_memory
    assert mem.event_shape == (3,) and mem.kind == "cubature"
    full = autocvi.fit(model, {"X": X, "y": y}, num_steps=300, progress_bar=False)
    mini = autocvi.fit(model, {"X": X, "y": y, "B": 30}, num_steps=600, progress_bar=False)
    qf, qm = full.posterior["W"], mini.posterior["W"]
    sd = np.sqrt(np.asarray(qf.variance))
    assert np.max(np.abs(np.asarray(qm.mean) - np.asarray(qf.mean)) / sd) < 0.05
    np.testing.assert_allclose(np.sqrt(np.asarray(qm.variance)), sd, rtol=0.05)
