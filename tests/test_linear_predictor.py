"""Tests of ``autocvi.linear_predictor.find_linear_predictor``.

Log densities are written as a NumPyro user writes them; the expected linear
predictor (``X @ w + c``) is computed independently with numpy, and the
decomposition is checked against ``fn`` itself, against finite differences,
and for independence of ``rest_fn`` from the target.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from autocvi.analysis.linear_predictor import LinearPredictor, find_linear_predictor

pytestmark = pytest.mark.float64

N, D = 7, 3
RNG = np.random.RandomState(0)
X = RNG.randn(N, D)
Z = RNG.randn(N, D)
W0 = RNG.randn(D)
Y01 = (RNG.rand(N) > 0.5).astype(float)
K = RNG.poisson(2.0, N).astype(float)
YR = RNG.randn(N)


@jax.jit
def _jit_linpred(X, w, c):
    return X @ w + c


def _deterministic_logits(X, w):
    # as inside a model: an intermediate recorded with numpyro.deterministic
    z = numpyro.deterministic("z", X @ w)
    return numpyro.deterministic("logits", z + 0.3)


@functools.partial(jax.jit, static_argnums=2)
def _nested_jit(X, w, scale):
    return jax.jit(lambda a, b: a @ b)(X, w) * scale - 1.0


# name -> (fn, values, target, expected eta as a numpy function of values or None
#          when only "affine in the target" is asserted)
VALID = {
    "bernoulli_logits": (
        lambda v: dist.Bernoulli(logits=v["X"] @ v["w"] + 0.3).log_prob(v["y"]),
        {"X": X, "w": W0, "y": Y01},
        "w",
        lambda v: v["X"] @ v["w"] + 0.3,
    ),
    "poisson_exp": (
        lambda v: dist.Poisson(jnp.exp(v["X"] @ v["w"])).log_prob(v["k"]),
        {"X": X, "w": W0, "k": K},
        "w",
        lambda v: v["X"] @ v["w"],
    ),
    "gp_classification": (
        lambda v: dist.Bernoulli(logits=v["f"]).log_prob(v["y"]),
        {"f": X[:, 0], "y": Y01},
        "f",
        lambda v: v["f"],
    ),
    "deterministic_intermediate": (
        lambda v: dist.Bernoulli(logits=_deterministic_logits(v["X"], v["w"])).log_prob(v["y"]),
        {"X": X, "w": W0, "y": Y01},
        "w",
        lambda v: v["X"] @ v["w"] + 0.3,
    ),
    "jit_helper": (
        lambda v: dist.Bernoulli(logits=_jit_linpred(v["X"], v["w"], 0.3)).log_prob(v["y"]),
        {"X": X, "w": W0, "y": Y01},
        "w",
        lambda v: v["X"] @ v["w"] + 0.3,
    ),
    "nested_jit_helper_poisson": (
        lambda v: dist.Poisson(jnp.exp(_nested_jit(v["X"], v["w"], 0.5))).log_prob(v["k"]),
        {"X": X, "w": W0, "k": K},
        "w",
        lambda v: 0.5 * (v["X"] @ v["w"]) - 1.0,
    ),
    "closure_data_whole_fn_jitted": (
        # data closed over (a jaxpr const) and the whole log density under jit
        jax.jit(lambda v: dist.Bernoulli(logits=jnp.asarray(X) @ v["w"] - 0.2).log_prob(v["y"])),
        {"w": W0, "y": Y01},
        "w",
        lambda v: X @ v["w"] - 0.2,
    ),
    # For location families the dominator closest to the output is numpyro's
    # standardised residual (y - X w) (/ scale): still affine in w with one
    # scalar predictor per element, which is all CVI needs.
    "student_t": (
        lambda v: dist.StudentT(3.0, v["X"] @ v["w"], 0.7).log_prob(v["y"]),
        {"X": X, "w": W0, "y": YR},
        "w",
        None,
    ),
    "normal": (
        lambda v: dist.Normal(v["X"] @ v["w"], 1.0).log_prob(v["y"]),
        {"X": X, "w": W0, "y": YR},
        "w",
        None,
    ),
    # Output (N, M) with target W (D, N): eta[n, m] = sum_d W[d, n] Z[d, m] is
    # affine in W and each output element depends only on its own eta[n, m],
    # so this IS a valid linear-predictor factor (one scalar predictor per
    # element, a_{nm} = e_n (x) Z[:, m]).
    "poisson_matrix_predictor": (
        lambda v: dist.Poisson(v["W"].T @ v["Z"]).log_prob(v["k"]),
        {
            "W": np.abs(RNG.randn(D, N)) + 0.1,
            "Z": np.abs(RNG.randn(D, 4)) + 0.1,
            "k": K[:, None] * np.ones(4),
        },
        "W",
        lambda v: v["W"].T @ v["Z"],
    ),
    # w ** 3 is not affine in w, but here the output has w's own shape: the
    # identity eta = w (eta_n = e_n^T w) is an affine scalar predictor per
    # element and the rest (Normal(eta**3, 1)) is elementwise, so the
    # decomposition is mathematically valid.
    "cube_elementwise_in_w": (
        lambda v: dist.Normal(v["w"] ** 3, 1.0).log_prob(v["y"]),
        {"w": W0, "y": YR[:D]},
        "w",
        lambda v: v["w"],
    ),
    # a single (unbatched) factor: a scalar predictor, trivially elementwise
    "scalar_factor": (
        lambda v: dist.Bernoulli(logits=v["X"][0] @ v["w"] + 0.3).log_prob(v["y"][0]),
        {"X": X, "w": W0, "y": Y01},
        "w",
        lambda v: v["X"][0] @ v["w"] + 0.3,
    ),
    # cumsum(X w) is affine in w (lower-triangular L @ X @ w): one predictor
    # per element, hence valid.
    "cumsum_predictor": (
        lambda v: dist.Bernoulli(logits=jnp.cumsum(v["X"] @ v["w"])).log_prob(v["y"]),
        {"X": X, "w": W0, "y": Y01},
        "w",
        lambda v: np.cumsum(v["X"] @ v["w"]),
    ),
}

NONE = {
    # output (N,) but the only affine quantity of that shape would be X @ w;
    # w enters through X @ (w ** 3), which is not affine in w.
    "cube_inside_predictor": (
        lambda v: dist.Normal(v["X"] @ v["w"] ** 3, 1.0).log_prob(v["y"]),
        {"X": X, "w": W0, "y": YR},
        "w",
    ),
    # scalar output whose only full-shape intermediate sum(exp(w)) is not affine
    "sum_exp_scalar": (
        lambda v: dist.Normal(jnp.sum(jnp.exp(v["w"])), 1.0).log_prob(v["y"]),
        {"w": W0, "y": 0.4},
        "w",
    ),
    # w enters through two different affine predictors
    "two_predictors": (
        lambda v: dist.Normal(v["X"] @ v["w"], jnp.exp(v["Z"] @ v["w"])).log_prob(v["y"]),
        {"X": X, "Z": Z, "w": W0, "y": YR},
        "w",
    ),
    # eta = X @ w is affine with the output's shape and dominates, but each
    # output element depends on every eta element (normaliser): not elementwise
    "log_softmax_couples": (
        lambda v: jax.nn.log_softmax(v["X"] @ v["w"]),
        {"X": X, "w": W0},
        "w",
    ),
    "normal_sum_couples": (
        lambda v: dist.Normal(v["X"] @ v["w"], 1.0).log_prob(v["y"]) + jnp.sum(v["X"] @ v["w"]),
        {"X": X, "w": W0, "y": YR},
        "w",
    ),
    "does_not_depend_on_target": (
        lambda v: dist.Normal(v["y"], 1.0).log_prob(v["y"]),
        {"w": W0, "y": YR},
        "w",
    ),
    "through_scan_is_opaque": (
        lambda v: jax.lax.scan(lambda c, x: (c, c + x), 0.0, v["X"] @ v["w"])[1],
        {"X": X, "w": W0},
        "w",
    ),
}


def _random_values(values, target, seed):
    rng = np.random.RandomState(seed)
    out = dict(values)
    t = np.asarray(values[target])
    noise = rng.randn(*t.shape)
    # keep positive targets positive (e.g. Poisson rates W.T @ Z)
    out[target] = t * np.exp(0.3 * noise) if np.all(t > 0) else t + noise
    return out


def _quantities(lp, fn, target, v, direction, h=1e-6):
    """Everything the decomposition test compares, computed under one jit."""
    t = v[target]
    eta = lp.eta_fn(v)
    eta_t = lambda t: lp.eta_fn({**v, target: t})  # noqa: E731
    rest_sum = lambda e, vals: jnp.sum(lp.rest_fn(e, vals))  # noqa: E731
    flat = lambda e: lp.rest_fn(e.reshape(eta.shape), v).ravel()  # noqa: E731
    return {
        "eta": eta,
        "fn": fn(v),
        "rest": lp.rest_fn(eta, v),
        "jac": jax.jacfwd(eta_t)(t),
        "eta0": eta_t(jnp.zeros_like(t)),
        "grad_eta_sum": jax.grad(lambda t: jnp.sum(eta_t(t)))(t),
        # rest_fn with eta held fixed, as a function of the target
        "grad_t": jax.grad(lambda t: rest_sum(eta, {**v, target: t}))(t),
        "rest_shifted": lp.rest_fn(eta, {**v, target: t + 100.0}),
        "rest_without": lp.rest_fn(eta, {k: x for k, x in v.items() if k != target}),
        "grad_dir": jnp.sum(jax.grad(rest_sum)(eta, v) * direction),
        "fd_dir": (rest_sum(eta + h * direction, v) - rest_sum(eta - h * direction, v)) / (2 * h),
        "jac_rest": jax.jacfwd(flat)(eta.ravel()),
    }


@pytest.mark.parametrize("name", sorted(VALID))
def test_decomposition(name):
    fn, values, target, expected = VALID[name]
    lp = find_linear_predictor(fn, values, target)
    assert isinstance(lp, LinearPredictor)
    quantities = jax.jit(functools.partial(_quantities, lp, fn, target))
    for seed in range(3):
        v = _random_values(values, target, seed)
        direction = np.random.RandomState(seed + 10).randn(*jax.eval_shape(fn, values).shape)
        q = jax.tree_util.tree_map(np.asarray, quantities(v, direction))
        eta, t = q["eta"], np.asarray(v[target])
        assert eta.shape == q["fn"].shape
        if expected is not None:
            np.testing.assert_allclose(eta, expected(v), rtol=1e-12, atol=1e-12)
        # rest_fn(eta_fn(v), v) == fn(v)
        np.testing.assert_allclose(q["rest"], q["fn"], rtol=1e-10, atol=1e-10)
        # eta is affine in the target: eta(t) = J(t) t + eta(0) at every t
        lin = np.tensordot(q["jac"], t, axes=t.ndim) + q["eta0"]
        np.testing.assert_allclose(eta, lin, rtol=1e-10, atol=1e-10)
        # reverse mode through eta_fn agrees with forward mode
        np.testing.assert_allclose(
            q["grad_eta_sum"], q["jac"].reshape(-1, *t.shape).sum(0), rtol=1e-12, atol=1e-12
        )
        if name in ("student_t", "normal"):
            # eta = +-(X w) / s + c: Jacobian rows parallel to the rows of X
            ratio = q["jac"] / X
            np.testing.assert_allclose(ratio, ratio[:, :1] * np.ones((1, D)), rtol=1e-10)
        # rest_fn does not depend on the target, and works without it
        assert np.all(q["grad_t"] == 0.0)
        np.testing.assert_array_equal(q["rest_shifted"], q["rest"])
        np.testing.assert_allclose(q["rest_without"], q["fn"], rtol=1e-10, atol=1e-10)
        # gradient through rest_fn w.r.t. eta matches central finite differences
        np.testing.assert_allclose(q["grad_dir"], q["fd_dir"], rtol=1e-6, atol=1e-6)
        # elementwise: the Jacobian of rest w.r.t. eta is diagonal
        off = q["jac_rest"] - np.diag(np.diag(q["jac_rest"]))
        assert np.all(off[np.isfinite(off)] == 0.0)


@pytest.mark.parametrize("name", sorted(NONE))
def test_none(name):
    fn, values, target = NONE[name]
    assert find_linear_predictor(fn, values, target) is None


def test_quadrature_usage_vmap_and_jit():
    """Gauss-Hermite style use: rest_fn vmapped over quadrature nodes of eta."""
    fn, values, target, _ = VALID["bernoulli_logits"]
    lp = find_linear_predictor(fn, values, target)
    eta = lp.eta_fn(values)
    nodes, weights = np.polynomial.hermite_e.hermegauss(20)
    weights = weights / weights.sum()
    sd = 0.7
    etas = eta[None, :] + sd * nodes[:, None]

    @jax.jit
    def expected(etas):
        return jnp.einsum("k,kn->n", weights, jax.vmap(lp.rest_fn, in_axes=(0, None))(etas, values))

    direct = np.einsum("k,kn->n", weights, np.stack([np.asarray(fn_at(e)) for e in etas]))
    np.testing.assert_allclose(expected(etas), direct, rtol=1e-10)


def fn_at(eta):
    return dist.Bernoulli(logits=eta).log_prob(Y01)


def test_inside_jit_with_traced_values():
    """Abstract (traced) values: the structural check alone decides."""
    fn, values, target, _ = VALID["poisson_exp"]

    @jax.jit
    def roundtrip(v):
        lp = find_linear_predictor(fn, v, target)
        assert lp is not None
        assert (
            find_linear_predictor(NONE["log_softmax_couples"][0], {"X": v["X"], "w": v["w"]}, "w")
            is None
        )
        return lp.rest_fn(lp.eta_fn(v), v)

    np.testing.assert_allclose(roundtrip(values), fn(values), rtol=1e-12)


def test_cached_per_fn_and_shapes():
    fn, values, target, _ = VALID["bernoulli_logits"]
    lp1 = find_linear_predictor(fn, values, target)
    assert find_linear_predictor(fn, values, target) is lp1
    bigger = {"X": np.ones((9, D)), "w": W0, "y": np.ones(9)}
    lp2 = find_linear_predictor(fn, bigger, target)
    assert lp2 is not lp1
    np.testing.assert_allclose(lp2.eta_fn(bigger), np.ones((9, D)) @ W0 + 0.3)
    with pytest.raises(ValueError):
        lp1.eta_fn(bigger)


def test_closure_over_outer_tracer():
    """A factor closing over a traced parameter (as inside a jitted CVI step)."""

    @jax.jit
    def step(s):
        fn = lambda v: dist.Poisson(jnp.exp(s * (v["X"] @ v["w"]))).log_prob(v["k"])  # noqa: E731
        values = {"X": X, "w": W0, "k": K}
        lp = find_linear_predictor(fn, values, "w")
        assert lp is not None
        return lp.eta_fn(values), lp.rest_fn(lp.eta_fn(values), values), fn(values)

    eta, rest, direct = step(0.5)
    np.testing.assert_allclose(eta, 0.5 * X @ W0, rtol=1e-12)
    np.testing.assert_allclose(rest, direct, rtol=1e-12)


def test_a_quadrature_axis_inside_the_rest_is_elementwise():
    """``sum_k w_k log sigmoid(eta + s x_k)``: a leading node axis added after eta and
    summed out again keeps element i on eta_i (the child of an integrated conditional);
    broadcasting eta along the *trailing* axis instead couples elements: rejected."""
    rng = np.random.default_rng(0)
    A, s = rng.normal(size=(30, 4)), rng.uniform(0.1, 1.0, 30)
    x, w = np.array([-1.5, 0.0, 1.5]), np.array([0.2, 0.6, 0.2])

    def fn(v):
        eta = A @ v["u"]
        nodes = eta[None] + s[None] * x[:, None]
        return jnp.sum(w[:, None] * jax.nn.log_sigmoid(nodes), 0)

    values = {"u": rng.normal(size=4)}
    lp = find_linear_predictor(fn, values, "u")
    assert lp is not None
    np.testing.assert_allclose(lp.eta_fn(values), A @ values["u"], rtol=1e-5)
    np.testing.assert_allclose(lp.rest_fn(lp.eta_fn(values), values), fn(values), rtol=1e-5)

    def coupled(v):  # element i reads every eta_j
        eta = A @ v["u"]
        return jnp.sum(jax.nn.log_sigmoid(eta[:, None] + eta[None, :]), 0)

    assert find_linear_predictor(coupled, values, "u") is None
