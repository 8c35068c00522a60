"""Gaussian blocks (prior + sites) against the dense natural-parameter engine.

The dense engine (``gaussian_blocks=False``) keeps a D x D natural parameter and
is the reference: at the fixed point of CVI both must give the same posterior
to 1e-8 (x64). The blocks must also pick their solver from structure and keep
O(N) state.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import autocvi
from autocvi.analysis.layout import site_posterior as _posterior
from autocvi.engine.step import cvi
from autocvi.plan.schedule import build_schedule

pytestmark = pytest.mark.float64


def logistic(X, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def random_walk_poisson(T, y=None):
    x = numpyro.sample("x", dist.GaussianRandomWalk(0.1, num_steps=T))
    with numpyro.plate("t", T):
        numpyro.sample("y", dist.Poisson(jnp.exp(1.0 + x)), obs=y)


def gp_classifier(K, y=None):
    n = y.shape[0]
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(K.shape[0]), K))
    with numpyro.plate("train", n):
        numpyro.sample("y", dist.Bernoulli(logits=f[:n]), obs=y)


def _logistic_data(n, d, seed=0):
    X = jax.random.normal(jax.random.PRNGKey(seed), (n, d)) / jnp.sqrt(d) * 2.0
    w = jax.random.normal(jax.random.PRNGKey(seed + 1), (d,))
    y = jax.random.bernoulli(jax.random.PRNGKey(seed + 2), jax.nn.sigmoid(X @ w))
    return {"X": X, "y": y.astype(jnp.float64)}


def _random_walk_data(T, seed=0):
    x = jnp.cumsum(0.1 * jax.random.normal(jax.random.PRNGKey(seed), (T,)))
    y = jax.random.poisson(jax.random.PRNGKey(seed + 1), jnp.exp(1.0 + x))
    return {"T": T, "y": y.astype(jnp.float64)}, x


def _gp_data(n_train=30, n_test=10):
    X = jax.random.normal(jax.random.PRNGKey(3), (n_train + n_test, 2))
    d2 = jnp.sum((X[:, None] - X[None]) ** 2, -1)
    K = 4.0 * jnp.exp(-0.5 * d2) + 1e-6 * jnp.eye(n_train + n_test)
    y = (X[:n_train, 0] > 0).astype(jnp.float64)
    return {"K": K, "y": y}


def _run(schedule, steps):
    alg = cvi(schedule)
    state = alg.init(jax.random.PRNGKey(0))
    step = jax.jit(alg.step)
    for _ in range(steps):
        state, info = step(state)
    return state, float(info.elbo)


def _fixed_point(model, data, steps):
    """Posterior (mean, cov) and ELBO of the block engine and of the dense engine."""
    graph = autocvi.trace(model, data)
    out = []
    for blocks in (True, False):
        schedule = build_schedule(graph, gaussian_blocks=blocks, step_size=1.0)
        state, elbo = _run(schedule, steps)
        (name,) = schedule.nodes
        if blocks:
            q = schedule.blocks[name].posterior(state.natural[name])
        else:
            q = _posterior(schedule.nodes[name].layout, state.natural[name])
        out.append((np.asarray(q.mean), np.asarray(q.covariance_matrix), elbo, schedule))
    return out


@pytest.mark.parametrize(
    "model,data,solver",
    [
        (logistic, _logistic_data(60, 8), "weight-space"),
        pytest.param(logistic, _logistic_data(20, 50), "function-space", marks=pytest.mark.slow),
        pytest.param(
            random_walk_poisson, _random_walk_data(80)[0], "markov", marks=pytest.mark.slow
        ),
        pytest.param(gp_classifier, _gp_data(), "function-space", marks=pytest.mark.slow),
    ],
    ids=["logistic-D<N", "logistic-D>N", "random-walk", "gp-with-test-points"],
)
def test_block_fixed_point_equals_dense_engine(model, data, solver):
    (m_b, c_b, e_b, sched), (m_d, c_d, e_d, _) = _fixed_point(model, data, steps=60)
    (block,) = sched.blocks.values()
    assert block.solver == solver
    np.testing.assert_allclose(m_b, m_d, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(c_b, c_d, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(e_b, e_d, rtol=1e-10)


@pytest.mark.slow  # CI runs it; the default run stays under 10 minutes
def test_wide_logistic_regression_keeps_no_d_by_d_matrix():
    # The papers' colon-cancer shape: N = 62, D = 2,000.
    data = _logistic_data(62, 2000)
    result = autocvi.fit(logistic, data, progress_bar=False, tol=1e-13, num_steps=300)
    block = result.schedule.blocks["w"]
    assert block.solver == "function-space"
    biggest = max(
        int(np.prod(np.shape(a)))
        for a in jax.tree_util.tree_leaves((result.state, block.prior, block.terms))
        if hasattr(a, "shape")
    )
    assert biggest <= 62 * 2000
    assert result.converged
    q = result.posterior["w"]
    assert isinstance(q, autocvi.blocks.BlockPosterior)
    draws = q.sample(jax.random.PRNGKey(0), (4000,))
    assert draws.shape == (4000, 2000)
    # Draws agree with the exact mean and variance the solver reports.
    np.testing.assert_allclose(
        draws.mean(0), q.mean, atol=5 * float(jnp.sqrt(q.variance.max() / 4000))
    )
    np.testing.assert_allclose(draws.var(0), q.variance, rtol=0.15)
    # The posterior is a correct fixed point: the ELBO's gradient w.r.t. the
    # sites' mean parameters vanishes, i.e. another full step changes nothing.
    sites = result.state.natural["w"]
    again, _, _, _ = block.update(sites, 1.0)
    for f in sites:
        np.testing.assert_allclose(again[f][0], sites[f][0], atol=1e-6)
        np.testing.assert_allclose(again[f][1], sites[f][1], atol=1e-6)


def test_dense_kernel_prior_uses_function_space_and_whitened_sites():
    data = _gp_data(40, 15)
    schedule = autocvi.plan(gp_classifier, data)
    block = schedule.blocks["f"]
    assert block.solver == "function-space" and block.num_sites == 40
    assert "function-space sites" in str(schedule)


def test_posterior_draws_are_site_values_for_predictive():
    data, _ = _random_walk_data(50)
    result = autocvi.fit(random_walk_poisson, data, progress_bar=False)
    draws = result.sample(jax.random.PRNGKey(1), 7)
    assert draws["x"].shape == (7, 50)
    pred = numpyro.infer.Predictive(random_walk_poisson, posterior_samples=draws)
    assert pred(jax.random.PRNGKey(2), T=50)["y"].shape == (7, 50)


@pytest.mark.slow
def test_random_walk_of_length_100000_is_recovered_and_calibrated():
    T = 100_000

    def model(T, y=None):
        x = numpyro.sample("x", dist.GaussianRandomWalk(0.01, num_steps=T))
        with numpyro.plate("t", T):
            numpyro.sample("y", dist.Poisson(jnp.exp(2.0 + x)), obs=y)

    x = jnp.cumsum(0.01 * jax.random.normal(jax.random.PRNGKey(0), (T,)))
    y = jax.random.poisson(jax.random.PRNGKey(1), jnp.exp(2.0 + x)).astype(jnp.float64)
    result = autocvi.fit(model, {"T": T, "y": y}, progress_bar=False)
    assert result.schedule.blocks["x"].solver == "markov"
    assert result.converged
    q = result.posterior["x"]
    z = (q.mean - x) / jnp.sqrt(q.variance)
    # Coverage of the truth: standardised errors have unit scale.
    assert 0.8 < float(jnp.sqrt(jnp.mean(z**2))) < 1.25


def ar1_scan(T, y=None):
    """An AR(1) prior written as a user writes a state-space model: a scan."""
    from numpyro.contrib.control_flow import scan

    def transition(x_prev, _):
        x = numpyro.sample("x", dist.Normal(0.8 * x_prev, 0.3))
        return x, x

    _, xs = scan(transition, 0.0, jnp.arange(T))
    with numpyro.plate("t", T):
        numpyro.sample("y", dist.Poisson(jnp.exp(1.0 + xs)), obs=y)


def ar1_dense(T, y=None):
    """The same prior as one MultivariateNormal with its tridiagonal precision."""
    q_diag = jnp.full((T,), (1 + 0.8**2) / 0.09).at[-1].set(1 / 0.09)
    Q = jnp.diag(q_diag) + jnp.diag(jnp.full((T - 1,), -0.8 / 0.09), 1)
    Q = Q + jnp.diag(jnp.full((T - 1,), -0.8 / 0.09), -1)
    x = numpyro.sample("x", dist.MultivariateNormal(jnp.zeros(T), precision_matrix=Q))
    with numpyro.plate("t", T):
        numpyro.sample("y", dist.Poisson(jnp.exp(1.0 + x)), obs=y)


@pytest.mark.slow
def test_ar1_scan_is_a_markov_block_with_the_dense_posterior():
    T = 60
    y = jax.random.poisson(jax.random.PRNGKey(5), 3.0, (T,)).astype(jnp.float64)
    data = {"T": T, "y": y}
    schedule = autocvi.plan(ar1_scan, data)
    assert schedule.blocks["x"].solver == "markov"
    # the scan's likelihood has no jaxpr split, yet gets Gauss-Hermite sites
    assert dict(schedule.nodes["x"].incoming)["y"] == "gauss-hermite"
    state, elbo = _run(build_schedule(autocvi.trace(ar1_scan, data), step_size=1.0), 60)
    q = schedule.blocks["x"].posterior(state.natural["x"])
    dense = build_schedule(autocvi.trace(ar1_dense, data), gaussian_blocks=False, step_size=1.0)
    state_d, elbo_d = _run(dense, 60)
    qd = _posterior(dense.nodes["x"].layout, state_d.natural["x"])
    np.testing.assert_allclose(q.mean, qd.mean, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(q.covariance_matrix, qd.covariance_matrix, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(elbo, elbo_d, rtol=1e-10)


@pytest.mark.slow
def test_sunspots_random_walk_equals_dense_engine():
    sm = pytest.importorskip("statsmodels.api")
    counts = np.round(sm.datasets.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy())

    def sunspots(T, y=None):
        x = numpyro.sample("x", dist.GaussianRandomWalk(0.3, num_steps=T))
        with numpyro.plate("year", T):
            numpyro.sample("y", dist.Poisson(jnp.exp(3.0 + x)), obs=y)

    data = {"T": counts.size, "y": jnp.asarray(counts)}
    (m_b, c_b, e_b, sched), (m_d, c_d, e_d, _) = _fixed_point(sunspots, data, steps=80)
    assert sched.blocks["x"].solver == "markov"
    np.testing.assert_allclose(m_b, m_d, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(c_b, c_d, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(e_b, e_d, rtol=1e-10)


@pytest.mark.parametrize(
    "model, data, name",
    [
        (logistic, _logistic_data(60, 8), "w"),
        (random_walk_poisson, _random_walk_data(50)[0], "x"),
    ],
)
def test_line_search_trial_handed_to_the_next_step_changes_nothing(model, data, name):
    # GaussianBlock.update keeps the accepted sites' ELBO and target; the next step
    # starts from them when it starts from those sites. Oracle: the same steps with no
    # cache, each computing its own start.
    block = autocvi.plan(model, data).blocks[name]
    assert block.cacheable
    with_cache = jax.jit(block.update)
    without = jax.jit(lambda s, b: block.update(s, b)[:3])
    a = b = block.init_sites()
    # (no Anderson history: the oracle takes plain steps)
    cache = block.empty_cache(a, memory=0)
    hits = 0
    for _ in range(8):
        hits += int(
            all(
                bool(jnp.all(x == y))
                for x, y in zip(
                    jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(cache["sites"])
                )
            )
        )
        a, elbo_a, step_a, cache = with_cache(a, 1.0, None, cache)
        b, elbo_b, step_b = without(b, 1.0)
        np.testing.assert_allclose(elbo_a, elbo_b, rtol=1e-12)
        assert float(step_a) == float(step_b)
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
        # the step returns the sites it keeps in the cache bit for bit, with
        # their fresh ELBO and target: the next step will use them
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(cache["sites"])):
            assert bool(jnp.all(x == y))
        fresh_elbo, fresh_target = block._value_and_target(a)
        np.testing.assert_allclose(cache["elbo"], fresh_elbo, rtol=1e-12)
        for x, y in zip(
            jax.tree_util.tree_leaves(cache["target"]),
            jax.tree_util.tree_leaves(fresh_target),
        ):
            np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
    assert hits == 7  # the cache was used on every step after the first


WIDE_PRIOR_VARIANCE = float(np.exp(12.0))


def wide_prior_classifier(y):
    n = y.shape[0]
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(n), WIDE_PRIOR_VARIANCE * jnp.eye(n)))
    with numpyro.plate("n", n):
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def test_steps_of_cvi_update_take_cvi_runs_path():
    # Each update continuing from the last one's state on the same data keeps the
    # block's cache and Anderson history, so stepping by hand (as the benchmarks trace
    # a run) follows the compiled loop of CVI.run. Without that, the second step
    # already differs on this slowly contracting model.
    y = (np.random.default_rng(1).uniform(size=20) < 0.5).astype(np.float64)
    cvi = autocvi.CVI(wide_prior_classifier, tol=0.0)
    state = cvi.init(jax.random.PRNGKey(0), y=y)
    ran = cvi.run(None, 15, init_state=state, y=y).elbo
    stepped = []
    for _ in range(15):
        state, elbo = cvi.update(state, y=np.array(y))  # equal values, another array
        stepped.append(float(elbo))
    np.testing.assert_allclose(stepped, ran, rtol=1e-9)


def test_anderson_extrapolation_solves_a_linear_fixed_point_exactly():
    # Oracle: for g(x) = M x + c in dimension d, the affine combination of d + 1 pairs
    # (x_j, g(x_j)) with zero residual is the fixed point (I - M)^-1 c, and Anderson's
    # step maps it through g: exact from d + 1 pairs in general position.
    from autocvi.blocks.gaussian_block import _anderson

    rng = np.random.default_rng(0)
    d = 4
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    M = q @ np.diag([0.95, 0.7, 0.4, -0.3]) @ q.T  # a slow mode, as CVI on sonar
    c = rng.normal(size=d)
    xs = [rng.normal(size=d)]
    for _ in range(d):
        xs.append(M @ xs[-1] + c)
    points = jnp.asarray(np.stack(xs[:-1]))
    history = {"points": points, "targets": points @ M.T + c, "count": jnp.asarray(d)}
    x = jnp.asarray(xs[-1])
    fixed_point = np.linalg.solve(np.eye(d) - M, c)
    np.testing.assert_allclose(
        _anderson(x, x @ M.T + c, history, ridge=0.0), fixed_point, rtol=1e-8
    )
    # the default ridge (1e-8 of the residual differences' scale) biases it a little
    np.testing.assert_allclose(_anderson(x, x @ M.T + c, history), fixed_point, rtol=1e-3)
    # no history: the plain step g(x)
    empty = dict(history, count=jnp.asarray(0))
    np.testing.assert_allclose(_anderson(x, x @ M.T + c, empty), x @ M.T + c, rtol=1e-12)


def test_anderson_steps_reach_the_wide_prior_optimum_three_times_sooner():
    # A prior variance of e^12 (sonar's kernel at the PG-SVI paper's hyperparameters):
    # each CVI step contracts slowly. Oracle: with an iid prior the optimal Gaussian
    # factorises, one two-parameter problem per label solved by Nelder-Mead on the
    # same Gauss-Hermite rule.
    from scipy import optimize

    from autocvi.analysis.expectations import GH_ORDER

    n, s2 = 30, WIDE_PRIOR_VARIANCE
    y = (np.random.default_rng(0).uniform(size=n) < 0.5).astype(np.float64)

    nodes, weights = np.polynomial.hermite_e.hermegauss(GH_ORDER)
    weights = weights / weights.sum()

    def neg_elbo(p, sign):
        m, v = p[0], np.exp(p[1])
        expected = np.sum(weights * -np.logaddexp(0.0, -sign * (m + np.sqrt(v) * nodes)))
        return 0.5 * (v / s2 + m**2 / s2 - 1 - np.log(v / s2)) - expected

    best = {
        label: optimize.minimize(
            neg_elbo, [0.0, np.log(s2)], args=(2 * label - 1,), method="Nelder-Mead",
            options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000},
        )
        for label in (0.0, 1.0)
    }  # fmt: skip
    mean = np.array([best[label].x[0] for label in y])
    var = np.exp([best[label].x[1] for label in y])
    optimum = -float(sum(best[label].fun for label in y))

    block = autocvi.plan(wide_prior_classifier, {"y": y}).blocks["f"]
    update = jax.jit(block.update)

    def steps_to_optimum(memory):
        sites = block.init_sites()
        cache = block.empty_cache(sites, memory=memory)
        for step in range(1, 1001):
            sites, elbo, _, cache = update(sites, 1.0, None, cache)
            if abs(float(elbo) - optimum) < 1e-5:
                return step, block.solve(sites)[0]
        raise AssertionError(f"memory {memory}: {float(elbo)} after 1000 steps, {optimum}")

    plain, _ = steps_to_optimum(0)
    accelerated, marginals = steps_to_optimum(5)
    assert 3 * accelerated <= plain, (accelerated, plain)  # 33 and 128 when written
    assert np.max(np.abs(marginals.mean - mean) / np.sqrt(var)) < 1e-3
    np.testing.assert_allclose(marginals.var, var, rtol=1e-3)


def test_plain_step_starts_at_twice_the_last_accepted_size():
    # Where full steps overshoot, the line search would find the same small step again
    # every iteration; the cache remembers it. Without history (memory 0) the step is
    # plain CVI's, from beta.
    block = autocvi.plan(logistic, _logistic_data(60, 8)).blocks["w"]
    sites = block.init_sites()
    remembered = dict(block.empty_cache(sites), step=jnp.asarray(0.125))
    _, _, taken, cache = block.update(sites, 1.0, None, remembered)
    assert float(taken) == 0.25 and float(cache["step"]) == 0.25
    plain = dict(block.empty_cache(sites, memory=0), step=jnp.asarray(0.125))
    assert float(block.update(sites, 1.0, None, plain)[2]) == 1.0


def test_update_on_new_data_does_not_step_towards_the_old_datas_target():
    # CVI.update may be called with new data each time (streaming): the block's cached
    # trial belongs to the old data and must not be used.
    old, new = _logistic_data(60, 8, seed=0), _logistic_data(60, 8, seed=10)
    cvi = autocvi.CVI(logistic)
    state = cvi.init(jax.random.PRNGKey(0), **old)
    for _ in range(3):
        state, _ = cvi.update(state, **old)
    stepped, elbo = cvi.update(state, **new)
    # oracle: the same update on the new data from a state with no cache at all
    bare = state._replace(state=state.state._replace(block_cache={}))
    expected, expected_elbo = cvi.update(bare, **new)
    np.testing.assert_allclose(elbo, expected_elbo, rtol=1e-12)
    for x, y in zip(
        jax.tree_util.tree_leaves(stepped.state.natural),
        jax.tree_util.tree_leaves(expected.state.natural),
    ):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
