"""Sites written one at a time in a Python loop are reported before anything compiles
(autocvi.analysis.unrolled): an AR(1) of 100 steps so written took 481 s to fit, 10.6 s
with ``scan``."""

import warnings

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.contrib.control_flow import scan

import autocvi
from autocvi.analysis.unrolled import find_unrolled

T = 24
Y = np.sin(np.arange(T) / 3.0)


def ar1_loop(y):
    """AR(1) as the tutorials first write it: one site per step."""
    phi = numpyro.sample("phi", dist.Uniform(-1.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    x = numpyro.sample("x_0", dist.Normal(0.0, 1.0))
    numpyro.sample("y_0", dist.Normal(x, 0.5), obs=y[0])
    for t in range(1, len(y)):
        x = numpyro.sample(f"x_{t}", dist.Normal(phi * x, sigma))
        numpyro.sample(f"y_{t}", dist.Normal(x, 0.5), obs=y[t])


def ar1_scan(y):
    phi = numpyro.sample("phi", dist.Uniform(-1.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))

    def step(x_prev, y_t):
        x = numpyro.sample("x", dist.Normal(phi * x_prev, sigma))
        numpyro.sample("y", dist.Normal(x, 0.5), obs=y_t)
        return x, None

    scan(step, jnp.zeros(()), y)


def independent_means(y, n=T):
    """n separate scalar means, each observed once (cheap to plan: every message exact)."""
    for i in range(n):
        m = numpyro.sample(f"mu[{i}]", dist.Normal(0.0, 1.0))
        numpyro.sample(f"obs[{i}]", dist.Normal(m, 1.0), obs=y[i])


def test_the_loop_is_found_with_its_sites():
    found = find_unrolled(autocvi.trace(ar1_loop, {"y": Y}))
    assert [(u.pattern, u.observed, len(u.names)) for u in found] == [
        ("x_{i}", False, T),
        ("y_{i}", True, T),
    ]
    assert found[0].names[:3] == ("x_0", "x_1", "x_2") and found[0].names[-1] == f"x_{T - 1}"
    assert found[0].distribution == "Normal" and found[0].shape == ()


@pytest.mark.parametrize("model", [ar1_scan, independent_means], ids=["scan", "short_loop"])
def test_no_report_for_scan_or_a_short_loop(model):
    kwargs = {"n": 19} if model is independent_means else {}
    graph = autocvi.trace(lambda y: model(y, **kwargs), {"y": Y})
    assert find_unrolled(graph) == ()


def test_sites_named_alike_but_of_different_shapes_are_not_one_loop():
    def model(y):
        for i in range(T):
            numpyro.sample(f"w{i}", dist.Normal(0.0, 1.0).expand([1 + i % 2]).to_event(1))
        with numpyro.plate("n", len(y)):
            numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y)

    graph = autocvi.trace(model, {"y": Y})
    assert find_unrolled(graph, min_sites=T // 2 + 1) == ()  # two shapes of 12 sites each
    assert len(find_unrolled(graph, min_sites=T // 2)) == 2


def test_plan_warns_names_the_sites_and_the_rewrite():
    with pytest.warns(autocvi.PerformanceWarning) as record:
        schedule = autocvi.plan(independent_means, {"y": Y})
    (message,) = [str(w.message) for w in record if w.category is autocvi.PerformanceWarning]
    assert "mu[0] ... mu[23]: 24 latent Normal sites" in message
    assert "obs[0] ... obs[23]: 24 observed" in message
    assert "numpyro.contrib.control_flow.scan" in message and "numpyro.plate" in message
    assert message in str(schedule)  # also in the plan's notes


def test_plan_of_a_plated_model_does_not_warn():
    def plated(y):
        with numpyro.plate("n", len(y)):
            m = numpyro.sample("mu", dist.Normal(0.0, 1.0))
            numpyro.sample("obs", dist.Normal(m, 1.0), obs=y)

    with warnings.catch_warnings():
        warnings.simplefilter("error", autocvi.PerformanceWarning)
        autocvi.plan(plated, {"y": Y})
