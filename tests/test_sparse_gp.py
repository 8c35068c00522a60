"""Sparse GPs written with the projection ``f = Kfu Kuu^-1 u`` (issue 15, oracles of item 4).

``jnp.linalg.solve(Kuu, u)`` is a ``custom_linear_solve`` in the jaxpr; the analysis sees
through it (its value is the LU solve it runs, linear in ``u`` for a constant ``Kuu``), so
a Gaussian likelihood is conjugate to q(u). Oracles: Titsias's collapsed optimum q*(u)
(one CVI step with step size 1 reaches it), the DTC log marginal likelihood (the ELBO of
this spelling at that q), and the full GP when the inducing inputs are the training inputs.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints
from scipy.stats import multivariate_normal

import autocvi

pytestmark = pytest.mark.float64

LENGTHSCALE, NOISE = 0.8, 0.3


def kernel(a, b):
    return np.exp(-0.5 * (a[:, None] - b[None, :]) ** 2 / LENGTHSCALE**2)


def data(n=80):
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(-3, 3, n))
    return x, np.sin(2 * x) + NOISE * rng.normal(size=n)


def sparse_gp(Kuu, Kfu, y=None):
    """How an SVGP user writes the projection: inducing values u, f = Kfu Kuu^-1 u."""
    u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Kuu.shape[0]), Kuu))
    f = Kfu @ jnp.linalg.solve(Kuu, u)
    with numpyro.plate("data", Kfu.shape[0]):
        numpyro.sample("y", dist.Normal(f, NOISE), obs=y)


def assert_titsias_posterior(q, Kuu, Kfu, y):
    """Titsias (2009): q*(u) = N(Kuu Sigma Kuf y / s^2, Kuu Sigma Kuu) with
    Sigma = (Kuu + Kuf Kfu / s^2)^-1; returns Qff = Kfu Kuu^-1 Kuf."""
    sigma = np.linalg.inv(Kuu + Kfu.T @ Kfu / NOISE**2)
    np.testing.assert_allclose(q.mean, Kuu @ sigma @ Kfu.T @ y / NOISE**2, atol=1e-8)
    np.testing.assert_allclose(q.covariance_matrix, Kuu @ sigma @ Kuu, atol=1e-8)
    return Kfu @ np.linalg.solve(Kuu, Kfu.T)


def test_one_step_gives_titsias_collapsed_posterior_and_the_dtc_evidence():
    x, y = data()
    z = np.linspace(-3, 3, 12)
    Kuu, Kfu = kernel(z, z) + 1e-6 * np.eye(12), kernel(x, z)
    schedule = autocvi.plan(sparse_gp, dict(Kuu=Kuu, Kfu=Kfu, y=y))
    assert "y (exact)" in str(schedule)  # the linear solve is seen through
    result = autocvi.fit(
        sparse_gp, dict(Kuu=Kuu, Kfu=Kfu, y=y), num_steps=1, tol=0, progress_bar=False
    )
    Qff = assert_titsias_posterior(result.posterior["u"], Kuu, Kfu, y)
    dtc = multivariate_normal(np.zeros(len(y)), Qff + NOISE**2 * np.eye(len(y))).logpdf(y)
    assert result.elbo[-1] == pytest.approx(dtc, abs=1e-6)


def test_inducing_inputs_at_the_training_inputs_give_the_full_gp():
    x, y = data(40)
    K = kernel(x, x) + 1e-6 * np.eye(len(x))
    result = autocvi.fit(sparse_gp, dict(Kuu=K, Kfu=K, y=y), progress_bar=False)
    assert result.converged
    full = K @ np.linalg.inv(K + NOISE**2 * np.eye(len(x)))
    np.testing.assert_allclose(result.posterior["u"].mean, full @ y, atol=1e-6)
    np.testing.assert_allclose(result.posterior["u"].covariance_matrix, K - full @ K, atol=1e-6)
    evidence = multivariate_normal(np.zeros(len(y)), K + NOISE**2 * np.eye(len(y))).logpdf(y)
    assert result.elbo[-1] == pytest.approx(evidence, abs=1e-5)


def test_a_solve_with_a_latent_matrix_is_not_called_conjugate():
    """Soundness: solve(tau K, u) = K^-1 u / tau is not Gamma-conjugate in a latent tau;
    the analysis must answer non-conjugate, not guess."""

    def model(K, y=None):
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
        u = numpyro.sample("u", dist.Normal(0.0, 1.0).expand([K.shape[0]]).to_event(1))
        numpyro.sample("y", dist.Normal(jnp.linalg.solve(tau * K, u), 1.0).to_event(1), obs=y)

    K = np.eye(3) + 0.1
    graph = autocvi.trace(model, dict(K=K, y=np.ones(3)))
    assert graph.edges[("y", "tau")].conjugate is False


def titsias_model(X, Z, y=None):
    """A sparse GP regression whose hyperparameters are learned: the projection plus
    Titsias's trace term as a ``numpyro.factor`` (it reads no latent), so the ELBO is
    the collapsed SVGP bound (Titsias 2009, Eq. 9) at the optimal q(u)."""
    lengthscale = numpyro.param("lengthscale", 1.0, constraint=constraints.positive)
    noise = numpyro.param("noise", 0.5, constraint=constraints.positive)

    def k(a, b):
        return jnp.exp(-0.5 * (a[:, None] - b[None, :]) ** 2 / lengthscale**2)

    Kuu = k(Z, Z) + 1e-6 * jnp.eye(Z.shape[0])
    Kfu = k(X, Z)
    A = jnp.linalg.solve(Kuu, Kfu.T).T
    u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Z.shape[0]), Kuu))
    numpyro.factor("trace_term", -0.5 * (X.shape[0] - jnp.sum(A * Kfu)) / noise**2)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(A @ u, noise), obs=y)


def titsias_bound(log_params, x, z, y):
    ell, s = np.exp(log_params)
    k = lambda a, b: np.exp(-0.5 * (a[:, None] - b[None, :]) ** 2 / ell**2)  # noqa: E731
    Kuu, Kfu = k(z, z) + 1e-6 * np.eye(len(z)), k(x, z)
    Qff = Kfu @ np.linalg.solve(Kuu, Kfu.T)
    fit = multivariate_normal(np.zeros(len(y)), Qff + s**2 * np.eye(len(y))).logpdf(y)
    return fit - 0.5 * (len(y) - np.trace(Qff)) / s**2


def titsias_optimum(x, z, y):
    """(lengthscale, noise) maximising Titsias's bound, and the bound there (Nelder-Mead)."""
    from scipy.optimize import minimize

    best = minimize(
        lambda p: -titsias_bound(p, x, z, y),
        np.log([1.0, 0.5]),
        method="Nelder-Mead",
        options=dict(xatol=1e-10, fatol=1e-12, maxiter=4000),
    )
    return np.exp(best.x), -best.fun


@pytest.mark.slow
def test_learned_sparse_gp_hyperparameters_maximise_the_titsias_bound():
    x, y = data(60)
    z = np.linspace(-3, 3, 8)
    result = autocvi.fit(titsias_model, dict(X=x, Z=z, y=y), progress_bar=False)
    (lengthscale, noise), bound = titsias_optimum(x, z, y)
    assert result.converged
    assert float(result.params["lengthscale"]) == pytest.approx(lengthscale, rel=1e-3)
    assert float(result.params["noise"]) == pytest.approx(noise, rel=1e-3)
    assert result.elbo[-1] == pytest.approx(bound, abs=1e-6)


# --------------------------------------------------------------------------
# The exact SVGP conditional f_i ~ Normal(k_i^T Kuu^-1 u, sqrt(k_ii - q_ii)) (issue 15, item 2):
# the planner integrates f into its child's expectation, q(u) p(f | u), as SVGP.
# --------------------------------------------------------------------------


def svgp(Kuu, Kfu, kff, y=None, likelihood="normal"):
    """How an SVGP user writes the model: inducing values u, then inside the data plate
    the exact conditional of f given u and the likelihood of y given f."""
    u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Kuu.shape[0]), Kuu))
    A = jnp.linalg.solve(Kuu, Kfu.T).T
    residual = jnp.clip(kff - jnp.sum(A * Kfu, -1), 1e-10)
    with numpyro.plate("data", Kfu.shape[0]):
        f = numpyro.sample("f", dist.Normal(A @ u, jnp.sqrt(residual)))
        if likelihood == "normal":
            numpyro.sample("y", dist.Normal(f, NOISE), obs=y)
        else:
            numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def svgp_inputs(n=80, m=12, classify=False):
    x, y = data(n)
    if classify:
        y = np.random.default_rng(1).uniform(size=n) < 1 / (1 + np.exp(-3 * np.sin(2 * x)))
        y = y.astype(float)
    z = np.linspace(-3, 3, m)
    return dict(Kuu=kernel(z, z) + 1e-6 * np.eye(m), Kfu=kernel(x, z), kff=np.ones(n), y=y)


def test_exact_conditional_one_step_gives_titsias_posterior_and_collapsed_bound():
    inputs = svgp_inputs()
    schedule = autocvi.plan(svgp, inputs)
    text = str(schedule)
    assert "f is integrated into y's expectation" in text
    assert "y (exact)" in text and " f " not in text.split("note:")[0]  # f is no node
    result = autocvi.fit(svgp, inputs, num_steps=1, tol=0, progress_bar=False)
    Kuu, Kfu, y = inputs["Kuu"], inputs["Kfu"], inputs["y"]
    q = result.posterior["u"]
    Qff = assert_titsias_posterior(q, Kuu, Kfu, y)
    # Titsias (2009), Eq. 9: log N(y | 0, Qff + s^2 I) - tr(Kff - Qff) / (2 s^2)
    bound = multivariate_normal(np.zeros(len(y)), Qff + NOISE**2 * np.eye(len(y))).logpdf(y)
    bound -= 0.5 * np.trace(np.eye(len(y)) - Qff) / NOISE**2
    assert result.elbo[-1] == pytest.approx(bound, abs=1e-6)
    assert "f" not in result.sample(0, 3)  # Predictive draws f from p(f | u)
    # q's marginal of f under q(u) p(f | u): N(A m, diag(A S A^T) + k_ii - q_ii)
    A = np.linalg.solve(Kuu, Kfu.T).T
    residual = inputs["kff"] - np.sum(A * Kfu, -1)
    q_f = result.posterior["f"]
    np.testing.assert_allclose(q_f.mean, A @ np.asarray(q.mean), atol=1e-8)
    cov = np.asarray(q.covariance_matrix)
    np.testing.assert_allclose(q_f.variance, np.sum((A @ cov) * A, -1) + residual, atol=1e-8)
    assert list(result.posterior) == ["u", "f"]  # the model's order


def lbfgs_minimum(loss, theta0):
    """scipy's L-BFGS-B on a JAX loss with its exact gradient (the oracles' optimiser)."""
    import jax
    from scipy.optimize import minimize

    value_and_grad = jax.jit(jax.value_and_grad(loss))
    return minimize(
        lambda t: tuple(np.asarray(v, dtype=float) for v in value_and_grad(t)),
        theta0,
        jac=True,
        method="L-BFGS-B",
        options=dict(maxiter=50000, gtol=1e-10, ftol=1e-15),
    )


def svgp_classification_optimum(Kuu, Kfu, kff, y):
    """The SVGP optimum by direct maximisation of its ELBO over q(u) = N(m, L L^T)
    (Hensman et al. 2015, Eq. 4; 60-node Gauss-Hermite; scipy L-BFGS)."""

    m = Kuu.shape[0]
    A = np.linalg.solve(Kuu, Kfu.T).T
    residual = np.clip(kff - np.sum(A * Kfu, -1), 1e-10, None)
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)
    weights = weights / np.sqrt(2 * np.pi)
    Kinv, logdetK = np.linalg.inv(Kuu), np.linalg.slogdet(Kuu)[1]
    tril = np.tril_indices(m)

    def neg_elbo(theta):
        mean = theta[:m]
        L = jnp.zeros((m, m)).at[tril].set(theta[m:])
        S = L @ L.T
        mu = A @ mean
        var = jnp.sum((A @ L) ** 2, -1) + residual
        f = mu[:, None] + jnp.sqrt(var)[:, None] * nodes[None]
        ell = jnp.sum(weights * -jnp.logaddexp(0.0, -(2 * y[:, None] - 1) * f))
        kl = 0.5 * (
            jnp.trace(Kinv @ S)
            + mean @ Kinv @ mean
            - m
            + logdetK
            - 2 * jnp.sum(jnp.log(jnp.abs(jnp.diag(L))))
        )
        return -(ell - kl)

    best = lbfgs_minimum(neg_elbo, np.concatenate([np.zeros(m), np.linalg.cholesky(Kuu)[tril]]))
    L = np.zeros((m, m))
    L[tril] = best.x[m:]
    return best.x[:m], L @ L.T, -best.fun


@pytest.mark.slow  # CI runs it; the default run stays under 10 minutes
def test_exact_conditional_classification_reaches_the_svgp_optimum():
    inputs = svgp_inputs(n=100, m=10, classify=True)
    inputs["likelihood"] = "bernoulli"
    schedule = autocvi.plan(svgp, inputs)
    assert "f is integrated into y's expectation" in str(schedule)
    assert "y (gauss-hermite)" in str(schedule)
    result = autocvi.fit(svgp, inputs, progress_bar=False)
    assert result.converged
    mean, cov, elbo = svgp_classification_optimum(
        inputs["Kuu"], inputs["Kfu"], inputs["kff"], inputs["y"]
    )
    q = result.posterior["u"]
    np.testing.assert_allclose(q.mean, mean, atol=2e-4)
    np.testing.assert_allclose(q.covariance_matrix, cov, atol=2e-4)
    assert result.elbo[-1] == pytest.approx(elbo, abs=1e-4)


def random_effects(sigma_y, y=None):
    """Group effects theta_j ~ Normal(mu, 1), one observation each: each effect carries
    its own data, so fixing q(theta | mu) = p(theta | mu) would throw that away."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("groups", sigma_y.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Normal(theta, sigma_y), obs=y)


def test_the_rule_fires_where_it_loses_less_than_mean_field_and_can_be_forced():
    # completeness: SVGP's small residuals -> integrated; soundness: informative
    # group effects -> kept; the option forces either way
    sparse = autocvi.plan(svgp, svgp_inputs())
    assert [it.latent for it in sparse.integrated] == ["f"]
    assert "f" not in sparse.nodes
    held = autocvi.plan(svgp, svgp_inputs(), integrate_conditionals=False)
    assert not held.integrated and "f" in held.nodes
    effects = dict(sigma_y=np.full(8, 0.1), y=np.linspace(-1, 1, 8))
    # one joint Gaussian over (mu, theta) contains both approximations: it is kept
    joint = autocvi.plan(random_effects, effects)
    assert joint.joint and not joint.integrated
    assert "keeps the joint Gaussian q(mu,theta)" in str(joint)
    # mean-field: each effect's own observation outweighs what mean-field drops
    kept = autocvi.plan(random_effects, effects, structure="mean-field")
    assert not kept.integrated and "theta" in kept.nodes
    assert "theta could be integrated into y's expectation" in str(kept)
    forced = autocvi.plan(
        random_effects, effects, structure="mean-field", integrate_conditionals=True
    )
    assert [it.latent for it in forced.integrated] == ["theta"]
    assert list(forced.nodes) == ["mu"]


def test_a_latent_read_by_two_factors_or_with_a_latent_scale_is_not_integrated():
    def two_children(Kuu, Kfu, y=None):
        u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Kuu.shape[0]), Kuu))
        with numpyro.plate("data", Kfu.shape[0]):
            f = numpyro.sample("f", dist.Normal(Kfu @ u, 0.01))
            numpyro.sample("y", dist.Normal(f, NOISE), obs=y)
            numpyro.sample("y2", dist.Normal(2 * f, NOISE), obs=y)

    def latent_scale(Kuu, Kfu, y=None):
        u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Kuu.shape[0]), Kuu))
        s = numpyro.sample("s", dist.HalfNormal(0.1))
        with numpyro.plate("data", Kfu.shape[0]):
            f = numpyro.sample("f", dist.Normal(Kfu @ u, s))
            numpyro.sample("y", dist.Normal(f, NOISE), obs=y)

    inputs = svgp_inputs()
    inputs = dict(Kuu=inputs["Kuu"], Kfu=inputs["Kfu"], y=inputs["y"])
    for model in (two_children, latent_scale):
        schedule = autocvi.plan(model, inputs)
        assert not schedule.integrated, model.__name__


def svgp_learned(X, Z, y=None):
    """The exact SVGP conditional with learned hyperparameters: no trace term written by
    hand; integrating f gives it (Titsias's bound is the SVGP ELBO at the optimal q(u))."""
    lengthscale = numpyro.param("lengthscale", 1.0, constraint=constraints.positive)
    noise = numpyro.param("noise", 0.5, constraint=constraints.positive)

    def k(a, b):
        return jnp.exp(-0.5 * (a[:, None] - b[None, :]) ** 2 / lengthscale**2)

    Kuu, Kfu = k(Z, Z) + 1e-6 * jnp.eye(Z.shape[0]), k(X, Z)
    A = jnp.linalg.solve(Kuu, Kfu.T).T
    u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Z.shape[0]), Kuu))
    residual = jnp.clip(1.0 - jnp.sum(A * Kfu, -1), 1e-10)
    with numpyro.plate("data", X.shape[0]):
        f = numpyro.sample("f", dist.Normal(A @ u, jnp.sqrt(residual)))
        numpyro.sample("y", dist.Normal(f, noise), obs=y)


@pytest.mark.slow
def test_exact_conditional_learned_hyperparameters_maximise_the_titsias_bound():
    x, y = data(60)
    z = np.linspace(-3, 3, 8)
    schedule = autocvi.plan(svgp_learned, dict(X=x, Z=z, y=y))
    # u's kernel reads learned params, so u and f would form one joint Gaussian (the
    # FITC model's exact posterior); integrating loses next to nothing and wins
    assert [it.latent for it in schedule.integrated] == ["f"] and not schedule.joint
    result = autocvi.fit(svgp_learned, dict(X=x, Z=z, y=y), progress_bar=False)
    (lengthscale, noise), bound = titsias_optimum(x, z, y)
    assert result.converged
    assert float(result.params["lengthscale"]) == pytest.approx(lengthscale, rel=1e-4)
    assert float(result.params["noise"]) == pytest.approx(noise, rel=1e-4)
    assert result.elbo[-1] == pytest.approx(bound, abs=1e-6)


@pytest.mark.slow  # CI runs it; the default run stays under 10 minutes
def test_integrate_conditionals_reaches_the_planner_through_fit_and_cvi():
    inputs = svgp_inputs(n=40, m=6)
    result = autocvi.fit(
        svgp, inputs, integrate_conditionals=False, num_steps=2, tol=0, progress_bar=False
    )
    assert not result.schedule.integrated and "f" in result.posterior
    cvi = autocvi.CVI(svgp)  # the default integrates f: CVI's data-as-params plan too
    state = cvi.init(0, **inputs)
    assert [it.latent for it in cvi.get_schedule(state).integrated] == ["f"]
    run = cvi.run(0, 1, **inputs)
    Kuu, Kfu, y = inputs["Kuu"], inputs["Kfu"], inputs["y"]
    sigma = np.linalg.inv(Kuu + Kfu.T @ Kfu / NOISE**2)
    mean = cvi.get_posterior(run.state)["u"].mean
    np.testing.assert_allclose(mean, Kuu @ sigma @ Kfu.T @ y / NOISE**2, atol=1e-8)


@pytest.mark.slow  # CI runs it; the default run stays under 10 minutes
def test_the_residual_rule_is_as_small_as_its_accuracy_allows():
    """Dense inducing inputs leave residuals so small that 8 nodes match the 32-node rule;
    three inducing inputs on [-3, 3] leave wide ones, which need more. The rule's size
    multiplies the child's cost (32 nodes made a banana SVGP's EM five times slower)."""
    for m, expected in ((10, 8), (3, 32)):
        inputs = svgp_inputs(n=100, m=m, classify=True)
        inputs["likelihood"] = "bernoulli"
        (it,) = autocvi.plan(svgp, inputs).integrated
        assert it.num_nodes == expected, (m, it.num_nodes)
    (it,) = autocvi.plan(svgp, svgp_inputs()).integrated  # a Gaussian child: exact with 2
    assert it.num_nodes == 2


def svgp_classification_learned(X, Z, y=None):
    amplitude = numpyro.param("amplitude", 1.0, constraint=constraints.positive)
    lengthscale = numpyro.param("lengthscale", 1.0, constraint=constraints.positive)

    def k(a, b):
        d2 = (a[:, None] - b[None, :]) ** 2
        if d2.ndim == 3:  # inputs with several columns
            d2 = jnp.sum(d2, -1)
        return amplitude**2 * jnp.exp(-0.5 * d2 / lengthscale**2)

    Kuu, Kfu = k(Z, Z) + 1e-6 * jnp.eye(Z.shape[0]), k(X, Z)
    A = jnp.linalg.solve(Kuu, Kfu.T).T
    u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Z.shape[0]), Kuu))
    residual = jnp.clip(amplitude**2 - jnp.sum(A * Kfu, -1), 1e-10)
    with numpyro.plate("data", X.shape[0]):
        f = numpyro.sample("f", dist.Normal(A @ u, jnp.sqrt(residual)))
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def svgp_joint_optimum(x, z, y):
    """The SVGP ELBO maximised jointly over q(u) = N(m, L L^T) and log (amplitude,
    length-scale) by scipy L-BFGS (60-node Gauss-Hermite): EM's fixed point must be this."""
    import jax

    m = len(z)
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)
    weights = weights / np.sqrt(2 * np.pi)
    tril = np.tril_indices(m)

    def neg_elbo(theta):
        amp, ell = jnp.exp(theta[0]), jnp.exp(theta[1])

        def k(a, b):
            return amp**2 * jnp.exp(-0.5 * (a[:, None] - b[None, :]) ** 2 / ell**2)

        Kuu, Kfu = k(z, z) + 1e-6 * jnp.eye(m), k(x, z)
        A = jnp.linalg.solve(Kuu, Kfu.T).T
        residual = jnp.clip(amp**2 - jnp.sum(A * Kfu, -1), 1e-10)
        mean = theta[2 : 2 + m]
        L = jnp.zeros((m, m)).at[tril].set(theta[2 + m :])
        var = jnp.sum((A @ L) ** 2, -1) + residual
        f = (A @ mean)[:, None] + jnp.sqrt(var)[:, None] * nodes[None]
        ell_term = jnp.sum(weights * -jnp.logaddexp(0.0, -(2 * y[:, None] - 1) * f))
        Lk = jnp.linalg.cholesky(Kuu)
        alpha = jax.scipy.linalg.solve_triangular(Lk, mean, lower=True)
        B = jax.scipy.linalg.solve_triangular(Lk, L, lower=True)
        kl = 0.5 * (
            jnp.sum(B**2)
            + alpha @ alpha
            - m
            + 2 * jnp.sum(jnp.log(jnp.diag(Lk)))
            - 2 * jnp.sum(jnp.log(jnp.abs(jnp.diag(L))))
        )
        return -(ell_term - kl)

    best = lbfgs_minimum(neg_elbo, np.concatenate([np.zeros(2), np.zeros(m), np.eye(m)[tril]]))
    return np.exp(best.x[:2]), -best.fun


@pytest.mark.slow
def test_dual_em_with_predictor_sites_reaches_the_joint_svgp_optimum_in_few_rounds():
    """t-SVGP's claim (Fig. 1-2): holding the sites on f (not q, not the message to u)
    while the kernel moves gives a tighter M-step bound and few EM rounds."""
    inputs = svgp_inputs(n=100, m=8, classify=True)
    x, y = data(100)[0], inputs["y"]
    z = np.linspace(-3, 3, 8)
    payload = dict(X=x, Z=z, y=y)
    dual = autocvi.fit(svgp_classification_learned, payload, progress_bar=False)
    standard = autocvi.fit(
        svgp_classification_learned,
        payload,
        em=autocvi.EMOptions(bound="standard"),
        progress_bar=False,
    )
    (amp, ell), elbo = svgp_joint_optimum(x, z, y)
    assert dual.converged
    assert float(dual.params["amplitude"]) == pytest.approx(amp, rel=1e-3)
    assert float(dual.params["lengthscale"]) == pytest.approx(ell, rel=1e-3)
    assert dual.elbo[-1] == pytest.approx(elbo, abs=1e-4)
    assert dual.em.rounds < standard.em.rounds / 2, (dual.em.rounds, standard.em.rounds)
