"""Monte Carlo messages to a joint Gaussian, against an exact posterior.

Oracle: a linear regression with a latent noise scale, written as users write it
(feature plate, separate intercept, HalfNormal sigma). Given sigma the posterior of
(b, w) is Gaussian in closed form, and p(sigma | y) is known up to a constant, so
the exact posterior mean and sd of (b, w) follow by quadrature over sigma.
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy.stats import halfnorm, norm

import autocvi


def regression(X, y=None):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("features", X.shape[1]):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Normal(b + X @ w, sigma), obs=y)


def _collinear(n=2000, d=10):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 3)) @ rng.normal(size=(3, d)) + 0.1 * rng.normal(size=(n, d))
    X = (X - X.mean(0)) / X.std(0)
    y = X[:, :3] @ np.array([1.0, -0.5, 0.25]) + 0.5 * rng.normal(size=n)
    return X, y


def exact_posterior(X, y):
    """Mean and sd of (b, w): a mixture over a fine sigma grid of the Gaussian
    posteriors given sigma, weighted by p(sigma | y) (w and b integrated out)."""
    n, d = X.shape
    A = np.hstack([np.ones((n, 1)), X])
    grid = np.linspace(0.3, 0.8, 801)
    logp, means, covs = [], [], []
    for s in grid:
        precision = A.T @ A / s**2 + np.eye(d + 1)
        cov = np.linalg.inv(precision)
        m = cov @ A.T @ y / s**2
        logdet = np.linalg.slogdet(precision)[1]
        logp.append(
            -0.5 * (y @ y / s**2 - m @ precision @ m)
            - n * np.log(s)
            - 0.5 * logdet
            + halfnorm.logpdf(s)
        )
        means.append(m)
        covs.append(cov)
    weight = np.exp(np.asarray(logp) - max(logp))
    weight /= weight.sum()
    means, covs = np.asarray(means), np.asarray(covs)
    mean = weight @ means
    second = np.einsum("g,gij->ij", weight, covs) + np.einsum("g,gi,gj->ij", weight, means, means)
    assert weight[0] < 1e-12 and weight[-1] < 1e-12  # the grid holds the posterior of sigma
    return mean, np.sqrt(np.diag(second) - mean**2)


@pytest.mark.slow  # CI runs it; the default run stays well under 10 minutes
def test_antithetic_draws_make_the_gaussian_likelihoods_message_exact():
    """The Bonnet/Price gradient of a factor quadratic in q's coordinates carries the
    noise H (mean(x) - m); with N = 2,000 collinear rows that kept q's means 0.05 sd
    from the posterior (0.1 on the zoo's 25-predictor regression). Antithetic pairs
    cancel it: q's means must be within 0.025 exact-posterior sd, its sds within 5%."""
    X, y = _collinear()
    mean, sd = exact_posterior(X, y)
    data = {"X": jnp.asarray(X, jnp.float32), "y": jnp.asarray(y, jnp.float32)}
    result = autocvi.fit(regression, data, progress_bar=False)
    assert result.converged
    (node,) = result.schedule.nodes
    assert {kind for _, kind in result.schedule.nodes[node].incoming} >= {"monte-carlo"}
    draws = result.sample(jax.random.PRNGKey(0), 20000)
    q = np.concatenate([np.asarray(draws["b"])[:, None], np.asarray(draws["w"])], axis=1)
    z = np.abs(q.mean(0) - mean) / sd
    assert z.max() < 0.025, z
    np.testing.assert_allclose(q.std(0) / sd, 1.0, atol=0.05)


# ------------------------------------------------ kinked log densities (Stein's identity)
@pytest.mark.parametrize("mean, sd", [(0.3, 0.5), (-1.0, 2.0), (0.0, 0.1)])
def test_expected_hessian_counts_the_curvature_of_a_kink(mean, sd):
    """``E[hess f]`` for ``f(x) = -|x| / b`` under N(mean, sd^2) is ``-2 N(0 | mean, sd^2)
    / b`` (the curvature sits at the kink; the pointwise Hessian is 0 almost everywhere).
    For a quadratic ``f`` the estimate is exact from any draws."""
    from autocvi.analysis.layout import LatentLayout
    from autocvi.engine.step import _expected_hessian

    b = 0.2
    lay = LatentLayout("x", "Normal", "Normal", (1,), 0, (1,))
    half = mean + sd * jax.random.normal(jax.random.PRNGKey(0), (20000, 1))
    xs = jnp.concatenate([half, 2.0 * mean - half])  # antithetic, as the engine draws
    m, precision = jnp.full((1,), mean), jnp.full((1,), 1.0 / sd**2)

    def kinked(x):
        return -jnp.sum(jnp.abs(x)) / b

    def quadratic(x):
        return -jnp.sum(1.5 * (x - 0.7) ** 2)

    for f, exact, tol in (
        (kinked, -2.0 * norm.pdf(0.0, mean, sd) / b, 0.03),
        (quadratic, -3.0, 1e-4),
    ):
        grads = jax.vmap(jax.grad(f))(xs)
        hessians = jax.vmap(lambda x, f=f: jnp.diagonal(jax.hessian(f)(x)))(xs)
        h = _expected_hessian(lay, xs, m, precision, grads, hessians)
        np.testing.assert_allclose(float(h[0]), exact, rtol=tol, atol=1e-5)
        if f is kinked:
            assert float(jnp.mean(hessians)) == 0.0  # what the pointwise mean alone saw


def test_laplace_prior_curvature_reaches_q():
    """A Laplace prior on one Gaussian node (Monte Carlo messages). Oracle: the best
    Gaussian q, maximising the ELBO in closed form (``E|w|`` of a Normal is closed form)
    with scipy. Before the Stein estimate q's sd was the likelihood's alone (0.58 against
    0.28), reported converged."""
    from scipy import optimize, stats

    y = np.random.RandomState(0).normal(0.2, 1.0, size=3)
    b = 0.2

    def model(y=None):
        w = numpyro.sample("w", dist.Laplace(0.0, b))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Normal(w, 1.0), obs=y)

    def neg_elbo(p):
        m, s = p[0], np.exp(p[1])
        e_abs = s * np.sqrt(2 / np.pi) * np.exp(-m * m / (2 * s * s)) + m * (
            1 - 2 * stats.norm.cdf(-m / s)
        )
        expected_lik = np.sum(-0.5 * np.log(2 * np.pi) - 0.5 * ((y - m) ** 2 + s * s))
        entropy = 0.5 * np.log(2 * np.pi * np.e * s * s)
        return -(-np.log(2 * b) - e_abs / b + expected_lik + entropy)

    opt = optimize.minimize(neg_elbo, [0.0, 0.0], method="Nelder-Mead", options={"xatol": 1e-9})
    m_opt, s_opt = opt.x[0], np.exp(opt.x[1])
    res = autocvi.fit(model, {"y": y}, progress_bar=False)
    q = res.posterior["w"]
    assert res.converged
    assert abs(float(q.mean) - m_opt) <= 0.1 * s_opt
    assert abs(float(jnp.sqrt(q.variance)) / s_opt - 1.0) <= 0.1
    assert abs(res.elbo_final - (-opt.fun)) <= 0.1


# ---------------------------------------------- what the compiled step holds


def _primitive_count(closed, name) -> int:
    count = 0

    def walk(j):
        nonlocal count
        for eqn in j.eqns:
            count += eqn.primitive.name == name
            for value in eqn.params.values():
                for v in value if isinstance(value, (tuple, list)) else (value,):
                    if hasattr(v, "jaxpr") and hasattr(v, "consts"):
                        walk(v.jaxpr)
                    elif hasattr(v, "eqns"):
                        walk(v)

    walk(closed.jaxpr)
    return count


def test_the_step_holds_the_likelihood_once_per_use():
    """A joint Gaussian with a Monte Carlo message from a negative-binomial likelihood:
    the compiled step evaluates the likelihood four times, for the message's gradient and
    its Hessian, the line search (its start one more candidate of the loop) and the
    reported ELBO. It held five (the line search's start apart), each adding to a
    compilation that is most of a first fit's wait."""
    from autocvi.engine.step import cvi

    sys.path.insert(0, str(Path(__file__).parent))
    from zoo.models import small_negative_binomial_glm

    schedule = autocvi.plan(*small_negative_binomial_glm())
    assert any(
        kind == "monte-carlo" for node in schedule.nodes.values() for _, kind in node.incoming
    )
    algorithm = cvi(schedule)
    state = jax.jit(algorithm.init)(jax.random.PRNGKey(0))
    per_density = _primitive_count(
        jax.make_jaxpr(lambda m, c, y: dist.NegativeBinomial2(m, c).log_prob(y).sum())(
            jnp.ones(3), 2.0, jnp.ones(3)
        ),
        "lgamma",
    )
    in_step = _primitive_count(jax.make_jaxpr(algorithm.step)(state), "lgamma")
    assert per_density > 0 and in_step == 4 * per_density, (in_step, per_density)
