"""Tests for autocvi.trace: exact variables, factors, edges and plates per construct.

Every test traces with ``classify=False``: the graph's structure only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpyro.contrib.control_flow import scan
from numpyro.distributions import constraints

import autocvi
from autocvi import ModelError, PlateInfo


def trace(model, data=None, **kw):
    return autocvi.trace(model, data or {}, classify=False, **kw)


def plate(name, size, dim, subsample_size=None):
    return PlateInfo(name, size, size if subsample_size is None else subsample_size, dim)


def variables(g):
    """name -> (role, distribution, shape, event_shape, plates) for every variable."""
    return {
        n: (v.role, v.distribution, v.shape, v.event_shape, v.plates)
        for n, v in g.variables.items()
    }


def factors(g):
    """name -> (kind, latents, params, plate names) for every factor."""
    return {
        n: (f.kind, f.latents, f.params, tuple(p.name for p in f.plates))
        for n, f in g.factors.items()
    }


# --------------------------------------------------------------- constructs


def regression(X, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ w + b, 1.0), obs=y)


def test_vector_site_expand_to_event():
    X, y = np.ones((20, 3)), np.zeros(20)
    g = trace(regression, {"X": X, "y": y})
    N = plate("N", 20, -1)
    assert variables(g) == {
        "w": ("latent", "Normal", (3,), (3,), ()),
        "b": ("latent", "Normal", (), (), ()),
        "y": ("observed", "Normal", (20,), (), (N,)),
    }
    assert g.variables["w"].batch_shape == ()
    assert g.variables["w"].support == "real^1"
    assert g.variables["y"].batch_shape == (20,)
    assert factors(g) == {
        "w": ("prior", ("w",), (), ()),
        "b": ("prior", ("b",), (), ()),
        "y": ("likelihood", ("w", "b"), (), ("N",)),
    }
    assert g.factors["y"].latents == ("w", "b")
    assert g.factors["y"].plates == (N,)
    assert g.latent_names == ("w", "b")
    assert g.observed_names == ("y",)
    assert g.params == {}
    assert g.factors_of("w") == ("w", "y")
    assert g.log_density_fn("y")(g.example_values).shape == (20,)


def test_plates_and_nested_plates_auto_dims():
    def model(y):
        with numpyro.plate("groups", 3):
            mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
            with numpyro.plate("items", 4):
                numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    g = trace(model, {"y": np.zeros((4, 3))})
    G, Ni = plate("groups", 3, -1), plate("items", 4, -2)
    # plates are listed outermost first; numpyro gives the outer plate dim -1
    assert variables(g) == {
        "mu": ("latent", "Normal", (3,), (), (G,)),
        "y": ("observed", "Normal", (4, 3), (), (G, Ni)),
    }
    assert factors(g) == {
        "mu": ("prior", ("mu",), (), ("groups",)),
        "y": ("likelihood", ("mu",), (), ("groups", "items")),
    }


def test_nested_plates_explicit_dims():
    def model(y):
        with numpyro.plate("groups", 3, dim=-2):
            mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
            tau = numpyro.sample("tau", dist.HalfNormal(1.0))
            with numpyro.plate("items", 4, dim=-1):
                numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=y)

    g = trace(model, {"y": np.zeros((3, 4))})
    G, Ni = plate("groups", 3, -2), plate("items", 4, -1)
    assert variables(g) == {
        "mu": ("latent", "Normal", (3, 1), (), (G,)),
        "tau": ("latent", "HalfNormal", (3, 1), (), (G,)),
        "y": ("observed", "Normal", (3, 4), (), (G, Ni)),
    }
    assert factors(g) == {
        "mu": ("prior", ("mu",), (), ("groups",)),
        "tau": ("prior", ("tau",), (), ("groups",)),
        "y": ("likelihood", ("mu", "tau"), (), ("groups", "items")),
    }


def test_same_plate_in_two_places_keeps_each_sites_dim():
    def model(y):
        with numpyro.plate("K", 2):
            a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", 3, dim=-2), numpyro.plate("K", 2):
            numpyro.sample("y", dist.Normal(a, 1.0), obs=y)

    g = trace(model, {"y": np.zeros((3, 2))})
    assert variables(g) == {
        "a": ("latent", "Normal", (2,), (), (plate("K", 2, -1),)),
        "y": ("observed", "Normal", (3, 2), (), (plate("N", 3, -2), plate("K", 2, -1))),
    }
    assert g.factors["y"].latents == ("a",)


def test_subsampled_plate():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", 100, subsample_size=10) as idx:
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    y = np.arange(100.0)
    g = trace(model, {"y": y})
    N = plate("N", 100, -1, subsample_size=10)
    assert N.subsampled and str(N) == "N[10/100]"
    assert variables(g) == {
        "mu": ("latent", "Normal", (), (), ()),
        "y": ("observed", "Normal", (10,), (), (N,)),
    }
    assert factors(g) == {
        "mu": ("prior", ("mu",), (), ()),
        "y": ("likelihood", ("mu",), (), ("N",)),
    }
    # the factor's log density is per minibatch element and scaled by N/B;
    # every evaluation uses the traced minibatch
    values = g.example_values
    fn, obs = g.site_fn("y")(values)
    fn2, obs2 = g.site_fn("y")({"mu": jnp.asarray(0.5)})
    np.testing.assert_array_equal(obs, obs2)
    assert set(np.asarray(obs).tolist()) <= set(y.tolist())
    lp = g.log_density_fn("y")(values)
    assert lp.shape == (10,)
    np.testing.assert_allclose(lp, 10.0 * fn.log_prob(obs), rtol=1e-6)


def test_multivariate_normal():
    def model(y):
        m = numpyro.sample("m", dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)))
        with numpyro.plate("N", 4):
            numpyro.sample("y", dist.MultivariateNormal(m, jnp.eye(2)), obs=y)

    g = trace(model, {"y": np.zeros((4, 2))})
    assert variables(g) == {
        "m": ("latent", "MultivariateNormal", (2,), (2,), ()),
        "y": ("observed", "MultivariateNormal", (4, 2), (2,), (plate("N", 4, -1),)),
    }
    assert factors(g) == {
        "m": ("prior", ("m",), (), ()),
        "y": ("likelihood", ("m",), (), ("N",)),
    }
    assert g.variables["y"].batch_shape == (4,)


def test_gaussian_random_walk():
    def model(y):
        s = numpyro.sample("s", dist.HalfNormal(1.0))
        x = numpyro.sample("x", dist.GaussianRandomWalk(s, num_steps=5))
        numpyro.sample("y", dist.Normal(x, 1.0).to_event(1), obs=y)

    g = trace(model, {"y": np.zeros(5)})
    assert variables(g) == {
        "s": ("latent", "HalfNormal", (), (), ()),
        "x": ("latent", "GaussianRandomWalk", (5,), (5,), ()),
        "y": ("observed", "Normal", (5,), (5,), ()),
    }
    assert factors(g) == {
        "s": ("prior", ("s",), (), ()),
        "x": ("prior", ("s", "x"), (), ()),
        "y": ("likelihood", ("x",), (), ()),
    }
    assert g.variables["s"].support == "positive"


def test_dirichlet_and_categorical_index_in_plate():
    def mixture(y, K):
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(K)))
        with numpyro.plate("components", K):
            mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        with numpyro.plate("data", len(y)):
            z = numpyro.sample("z", dist.Categorical(pi))
            numpyro.sample("y", dist.Normal(mu[z], 1.0), obs=y)

    g = trace(mixture, {"y": np.zeros(6), "K": 3})
    D = plate("data", 6, -1)
    assert variables(g) == {
        "pi": ("latent", "Dirichlet", (3,), (3,), ()),
        "mu": ("latent", "Normal", (3,), (), (plate("components", 3, -1),)),
        "z": ("latent", "CategoricalProbs", (6,), (), (D,)),
        "y": ("observed", "Normal", (6,), (), (D,)),
    }
    assert factors(g) == {
        "pi": ("prior", ("pi",), (), ()),
        "mu": ("prior", ("mu",), (), ("components",)),
        "z": ("prior", ("pi", "z"), (), ("data",)),
        "y": ("likelihood", ("mu", "z"), (), ("data",)),
    }
    assert g.variables["pi"].support == "simplex"
    assert g.variables["z"].discrete and not g.variables["mu"].discrete
    assert g.log_density_fn("y")(g.example_values).shape == (6,)


def test_deterministic_is_seen_through():
    def model(y):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        c = numpyro.sample("c", dist.Normal(0.0, 1.0))
        s = numpyro.deterministic("s", a + jnp.exp(b))
        t = numpyro.deterministic("t", 2.0 * s)
        numpyro.deterministic("unused", c)
        numpyro.sample("y", dist.Normal(t, 1.0), obs=y)

    g = trace(model, {"y": 1.0})
    assert set(g.variables) == {"a", "b", "c", "y"}
    assert set(g.factors) == {"a", "b", "c", "y"}
    assert g.factors["y"].latents == ("a", "b")
    assert g.factors_of("c") == ("c",)


def test_param_attached_to_the_factors_that_use_it():
    def model(y):
        loc = numpyro.param("loc", jnp.zeros(2))
        scale = numpyro.param("scale", 1.0, constraint=constraints.positive)
        numpyro.param("unused", 3.0)
        w = numpyro.sample("w", dist.Normal(loc, 1.0).to_event(1))
        with numpyro.plate("N", 5):
            numpyro.sample("y", dist.Normal(w.sum(), scale), obs=y)

    g = trace(model, {"y": np.zeros(5)})
    assert set(g.variables) == {"w", "y"}
    assert set(g.params) == {"loc", "scale", "unused"}
    assert g.params["loc"].shape == (2,) and g.params["loc"].constraint == "real"
    assert g.params["scale"].shape == () and g.params["scale"].constraint == "positive"
    assert factors(g) == {
        "w": ("prior", ("w",), ("loc",), ()),
        "y": ("likelihood", ("w",), ("scale",), ("N",)),
    }
    assert "loc" in g.example_values and "scale" in g.example_values


def test_numpyro_factor_is_a_factor_not_a_variable():
    def model(y):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        c = numpyro.param("c", 2.0)
        numpyro.factor("penalty", -c * (a - b) ** 2)
        with numpyro.plate("N", 3):
            numpyro.factor("per_item", -jnp.abs(y - a))
            numpyro.factor("scalar_in_plate", -(b**2))  # broadcast over the plate

    g = trace(model, {"y": np.zeros(3)})
    assert set(g.variables) == {"a", "b"}
    N = plate("N", 3, -1)
    assert factors(g) == {
        "a": ("prior", ("a",), (), ()),
        "b": ("prior", ("b",), (), ()),
        "penalty": ("factor", ("a", "b"), ("c",), ()),
        "per_item": ("factor", ("a",), (), ("N",)),
        "scalar_in_plate": ("factor", ("b",), (), ("N",)),
    }
    assert g.factors["per_item"].plates == (N,)
    assert g.factors["penalty"].distribution == "factor"
    assert g.log_density_fn("per_item")(g.example_values).shape == (3,)


def test_python_loop_time_series():
    def model(T):
        x = numpyro.sample("x_0", dist.Normal(0.0, 1.0))
        for t in range(1, T):
            x = numpyro.sample(f"x_{t}", dist.Normal(0.9 * x, 1.0))

    g = trace(model, {"T": 5})
    assert variables(g) == {f"x_{t}": ("latent", "Normal", (), (), ()) for t in range(5)}
    expected = {"x_0": ("prior", ("x_0",), (), ())}
    expected.update({f"x_{t}": ("prior", (f"x_{t - 1}", f"x_{t}"), (), ()) for t in range(1, 5)})
    assert factors(g) == expected


def test_scan_time_series():
    def model(y):
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        tau = numpyro.sample("tau", dist.HalfNormal(1.0))

        def step(x_prev, y_t):
            x = numpyro.sample("x", dist.Normal(x_prev, sigma))
            numpyro.sample("y", dist.Normal(x, tau), obs=y_t)
            return x, None

        scan(step, 0.0, y)

    g = trace(model, {"y": np.zeros(6)})
    assert variables(g) == {
        "sigma": ("latent", "HalfNormal", (), (), ()),
        "tau": ("latent", "HalfNormal", (), (), ()),
        "x": ("latent", "Normal", (6,), (), ()),
        "y": ("observed", "Normal", (6,), (), ()),
    }
    # dependencies are traced into the scan body: the transition does not see
    # tau and the emission does not see sigma
    assert factors(g) == {
        "sigma": ("prior", ("sigma",), (), ()),
        "tau": ("prior", ("tau",), (), ()),
        "x": ("prior", ("sigma", "x"), (), ()),
        "y": ("likelihood", ("tau", "x"), (), ()),
    }
    assert g.log_density_fn("x")(g.example_values).shape == (6,)


def test_dependencies_through_jitted_helpers_and_lax_cond():
    @jax.jit
    def helper(a, b):
        return 2.0 * a, jnp.exp(b)

    def model(y1, y2):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        c = numpyro.sample("c", dist.Normal(0.0, 1.0))
        u, v = helper(a, b)
        numpyro.sample("y1", dist.Normal(u, 1.0), obs=y1)
        w = jax.lax.cond(c > 0, lambda: v, lambda: -v)
        numpyro.sample("y2", dist.Normal(w, 1.0), obs=y2)

    g = trace(model, {"y1": 0.0, "y2": 0.0})
    assert g.factors["y1"].latents == ("a",)
    assert g.factors["y2"].latents == ("b", "c")


@settings(max_examples=20, deadline=None)
@given(st.lists(st.sets(st.integers(0, 5), max_size=3), min_size=1, max_size=6))
def test_loop_of_sites_with_random_parents(parent_sets):
    """A Python loop where site x_i uses an arbitrary subset of earlier sites."""
    parents = [sorted(p for p in ps if p < i) for i, ps in enumerate(parent_sets)]

    def model():
        xs = []
        for i, ps in enumerate(parents):
            loc = sum((jnp.sin(xs[p]) for p in ps), 0.0)
            xs.append(numpyro.sample(f"x{i}", dist.Normal(loc, 1.0)))

    g = trace(model)
    for i, ps in enumerate(parents):
        assert g.factors[f"x{i}"].latents == tuple(f"x{p}" for p in ps) + (f"x{i}",)


# ------------------------------------------------------------- data handling


def test_non_array_data_values_are_passed_through():
    def model(X, N, use_bias=True, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0)) if use_bias else 0.0
        with numpyro.plate("N", N):
            numpyro.sample("y", dist.Normal(X * w + b, 1.0), obs=y)

    g = trace(model, {"X": np.ones(10), "N": 10, "use_bias": False, "y": np.zeros(10)})
    assert set(g.variables) == {"w", "y"}
    assert g.factors["y"].latents == ("w",)
    assert g.variables["y"].plates == (plate("N", 10, -1),)


def test_model_without_latent_sites():
    def model(y):
        with numpyro.plate("N", 3):
            numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y)

    g = trace(model, {"y": np.zeros(3)})
    assert variables(g) == {"y": ("observed", "Normal", (3,), (), (plate("N", 3, -1),))}
    assert factors(g) == {"y": ("likelihood", (), (), ("N",))}
    assert g.latent_names == ()
    assert g.log_density_fn("y")({}).shape == (3,)


@pytest.mark.parametrize(
    "obs",
    [[0.5, 1.0, 2.0], (0.5, 1.0, 2.0), np.array([0.5, 1.0, 2.0]), np.array([1, 2, 3])],
    ids=["list", "tuple", "numpy-float", "numpy-int"],
)
def test_observed_value_as_list_or_numpy(obs):
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", 3):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    g = trace(model, {"y": obs})
    assert variables(g)["y"] == ("observed", "Normal", (3,), (), (plate("N", 3, -1),))
    assert g.factors["y"].latents == ("mu",)
    assert g.log_density_fn("y")(g.example_values).shape == (3,)


def test_masked_non_finite_observations_are_accepted():
    y = np.array([1.0, np.nan, 2.0])

    def with_mask(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", 3), numpyro.handlers.mask(mask=jnp.isfinite(y)):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    g = trace(with_mask, {"y": y})
    assert g.factors["y"].latents == ("mu",)
    lp = g.log_density_fn("y")(g.example_values)
    assert lp.shape == (3,) and bool(jnp.all(jnp.isfinite(lp))) and float(lp[1]) == 0.0

    def with_obs_mask(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", 3):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y, obs_mask=np.isfinite(y))

    g = trace(with_obs_mask, {"y": y})
    # numpyro's obs_mask makes an observed part and an imputed latent part
    assert variables(g)["y_observed"][0] == "observed"
    assert variables(g)["y_unobserved"][0] == "latent"
    assert g.factors["y_observed"].latents == ("mu",)


def test_rng_key_accepts_int_and_key():
    g1 = trace(regression, {"X": np.ones((4, 2)), "y": np.zeros(4)}, rng_key=1)
    g2 = trace(regression, {"X": np.ones((4, 2)), "y": np.zeros(4)}, rng_key=jax.random.key(1))
    assert factors(g1) == factors(g2)


def test_trace_is_fast_on_100k_observations():
    N = 100_000
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(N, 5)), rng.normal(size=N)

    def model(X, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([5]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        s = numpyro.sample("s", dist.HalfNormal(1.0))
        with numpyro.plate("N", X.shape[0]):
            numpyro.sample("y", dist.Normal(X @ w + b, s), obs=y)

    g = trace(model, {"X": X, "y": y})
    assert g.factors["y"].latents == ("w", "b", "s")
    assert g.variables["y"].plates == (plate("N", N, -1),)


def test_long_python_loop_is_traced():
    def model(T):
        x = numpyro.sample("x_0", dist.Normal(0.0, 1.0))
        for t in range(1, T):
            x = numpyro.sample(f"x_{t}", dist.Normal(x, 1.0))

    g = trace(model, {"T": 100})
    assert g.factors["x_99"].latents == ("x_98", "x_99")


# ------------------------------------------------------------------ errors


def test_error_unknown_data_key():
    with pytest.raises(ModelError) as e:
        trace(regression, {"X": np.ones((3, 2)), "Y": np.zeros(3)})
    msg = str(e.value)
    assert "'Y'" in msg and "regression()" in msg and "Did you mean 'y'?" in msg
    assert "Rename or drop the key" in msg


def test_error_names_a_partial_models_function():
    import functools

    with pytest.raises(ModelError, match=r"regression\(\) does not accept"):
        trace(functools.partial(regression, X=np.ones((3, 2))), {"Z": 1})


def test_error_missing_required_argument():
    with pytest.raises(ModelError, match=r"needs the argument 'X'.*data=\{'X'"):
        trace(regression, {"y": np.zeros(3)})


def test_error_positional_only_argument():
    def model(X, /, y=None):
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y)

    with pytest.raises(ModelError, match=r"'X' is a positional-only argument"):
        trace(model, {"X": 1.0, "y": 0.0})


def test_error_model_raises_names_the_site_after():
    # X has 3 columns, w has 2: the matmul after site 'w' fails
    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with numpyro.plate("N", X.shape[0]):
            numpyro.sample("y", dist.Normal(X @ w, 1.0), obs=y)

    with pytest.raises(ModelError) as e:
        trace(model, {"X": np.ones((3, 3)), "y": np.zeros(3)})
    msg = str(e.value)
    assert "model() raised TypeError after site 'w'" in msg
    assert "when run with the data" in msg
    assert isinstance(e.value.__cause__, TypeError)


def test_error_model_raises_at_a_site():
    # the distribution's batch shape (4,) does not fit plate N of size 3
    def model(y):
        numpyro.sample("w", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", 3):
            numpyro.sample("y", dist.Normal(jnp.zeros(4), 1.0), obs=y)

    with pytest.raises(ModelError, match=r"raised ValueError at site 'y'"):
        trace(model, {"y": np.zeros(3)})


def test_error_model_raises_hints_at_missing_none_argument():
    def model(X, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", len(y)):
            numpyro.sample("y", dist.Normal(X * w, 1.0), obs=y)

    with pytest.raises(ModelError) as e:
        trace(model, {"X": np.ones(3)})
    msg = str(e.value)
    assert "after site 'w'" in msg and "data has no value for 'y'" in msg


def test_error_observed_site_without_value():
    with pytest.raises(ModelError) as e:
        trace(regression, {"X": np.ones((3, 2))})
    msg = str(e.value)
    assert "site 'y'" in msg and "data['y']" in msg and "sampled as a latent" in msg
    with pytest.raises(ModelError, match=r"site 'y'.*data\['y'\]"):
        trace(regression, {"X": np.ones((3, 2)), "y": None})


def test_error_non_finite_observations():
    y = np.array([0.0, 1.0, np.inf, np.nan])
    with pytest.raises(ModelError) as e:
        trace(regression, {"X": np.ones((4, 2)), "y": y})
    msg = str(e.value)
    assert "site 'y'" in msg and "2 non-finite entries" in msg and "index (2,)" in msg
    assert "obs_mask" in msg and "impute" in msg


def test_error_observation_outside_support():
    def model(y):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", 3):
            numpyro.sample("y", dist.Bernoulli(logits=a), obs=y)

    with pytest.raises(ModelError) as e:
        trace(model, {"y": np.array([0, 1, 2])})
    msg = str(e.value)
    assert "site 'y'" in msg and "outside the support" in msg and "index (2,)" in msg

    def masked(y):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", 3), numpyro.handlers.mask(mask=y < 2):
            numpyro.sample("y", dist.Bernoulli(logits=a), obs=y)

    g = trace(masked, {"y": np.array([0, 1, 2])})
    assert g.factors["y"].latents == ("a",)


def test_error_shape_mismatch_with_plate():
    with pytest.raises(ModelError) as e:
        # plate N has the size of X (5) but y has 4 entries; numpyro broadcasts (4,1)
        # against (5,) silently, autocvi refuses
        trace(regression, {"X": np.ones((5, 2)), "y": np.zeros((5, 1))})
    msg = str(e.value)
    assert "site 'y'" in msg and "(5, 1)" in msg and "plate 'N'" in msg.replace("N[5]", "")
    assert "plates: N[5] at dim -1" in msg

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", X.shape[0]):
            numpyro.sample("y", dist.Normal(X * w, 1.0), obs=y)

    with pytest.raises(ModelError) as e:
        trace(model, {"X": np.ones(5), "y": np.zeros(4)})
    msg = str(e.value)
    assert "site 'y'" in msg and "(4,)" in msg and "plate 'N' has size 5" in msg


def test_error_full_data_in_subsampled_plate():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", 100, subsample_size=10):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    with pytest.raises(ModelError) as e:
        trace(model, {"y": np.zeros(100)})
    msg = str(e.value)
    assert "site 'y'" in msg and "subsampled" in msg and "obs=y[idx]" in msg


def test_error_vector_observation_without_plate():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    with pytest.raises(ModelError) as e:
        trace(model, {"y": np.zeros(3)})
    msg = str(e.value)
    assert "site 'y'" in msg and "numpyro.plate" in msg and ".expand" in msg


def test_error_python_control_flow_on_a_latent():
    def model(y):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        if z > 0:
            numpyro.sample("y", dist.Normal(z, 1.0), obs=y)
        else:
            numpyro.sample("y", dist.Normal(-z, 1.0), obs=y)

    with pytest.raises(ModelError) as e:
        trace(model, {"y": 0.0})
    msg = str(e.value)
    assert "after site 'z'" in msg and "jnp.where" in msg and "lax.cond" in msg


@pytest.mark.parametrize(
    "prior",
    [
        dist.Gamma(2.0, 3.0).expand([4]),
        dist.Dirichlet(jnp.ones(3)),
        dist.HalfCauchy(1.0),
        dist.Normal(jnp.zeros(2), 1.0).to_event(1),
        pytest.param(dist.LKJCholesky(3, 2.0), marks=pytest.mark.slow),
        dist.ImproperUniform(dist.constraints.positive, (), (2,)),  # no sampler
    ],
    ids=lambda d: type(d).__name__,
)
def test_initial_draws_are_compiled_and_equal_the_eager_draws(prior):
    """Start values are drawn by one compiled program per site (the eager samplers compile
    primitive by primitive: seconds of a cold trace); the values are NumPyro's own eager
    init strategies' (the oracle), for samplers with rejection loops and for a prior
    without a sampler (NumPyro's fallback to init_to_uniform)."""
    from numpyro.infer.initialization import init_to_median, init_to_sample

    from autocvi.jaxpr import clear_program_cache, program_cache_info
    from autocvi.model.trace import _compiled_draw

    key = jax.random.PRNGKey(3)
    msg = {
        "type": "sample",
        "name": "z",
        "fn": prior,
        "is_observed": False,
        "value": None,
        "kwargs": {"rng_key": key, "sample_shape": ()},
    }
    for strategy in (init_to_sample, init_to_median(num_samples=15)):
        clear_program_cache()
        got = _compiled_draw(strategy, msg)
        assert program_cache_info()["misses"] == 1, "drawn eagerly, not compiled"
        want = strategy(dict(msg))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=1e-6)


def test_a_distribution_jit_cannot_take_is_drawn_eagerly():
    """Completeness of the fallback: a draw that only works on concrete values."""
    from autocvi.model.trace import _compiled_draw

    def concrete_only(site):
        return jnp.asarray(float(site["fn"].loc) + 1.0)  # float() fails on a tracer

    msg = {"fn": dist.Normal(2.0, 1.0), "kwargs": {"rng_key": jax.random.PRNGKey(0)}}
    assert float(_compiled_draw(concrete_only, msg)) == 3.0
