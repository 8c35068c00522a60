"""Compile once per model and shapes (issue 14): ``autocvi.jaxpr.structural_jit``.

Soundness: a shared program never computes with another closure's data (the
oracle is the function run eagerly / a fit after the cache is cleared).
Completeness: the same structure with new values, or a new seed, does not compile again.
"""

import importlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import autocvi
from autocvi.jaxpr import clear_program_cache, program_cache_info, structural_jit
from autocvi.jaxpr import compile as compile_module


def _closure(data):
    def f(x):
        return jnp.sum(jnp.sin(data) * x), data.mean() + x

    return f


def test_closures_over_new_data_share_one_program():
    clear_program_cache()
    rng = np.random.RandomState(0)
    x = jnp.float32(0.7)
    for _ in range(3):
        data = jnp.asarray(rng.normal(size=5), jnp.float32)
        got = structural_jit(_closure(data))(x)
        want = _closure(data)(x)  # eager: the oracle
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6)
    info = program_cache_info()
    assert info["misses"] == 1 and info["hits"] == 2, info


def test_new_shapes_or_dtypes_compile_anew():
    clear_program_cache()
    x = jnp.float32(0.7)
    structural_jit(_closure(jnp.ones(5)))(x)
    structural_jit(_closure(jnp.ones(6)))(x)
    structural_jit(_closure(jnp.ones(5, jnp.int32)))(x)
    assert program_cache_info()["misses"] == 3


def test_enable_compilation_cache_sets_jax_persistent_cache(tmp_path):
    old = jax.config.jax_compilation_cache_dir
    try:
        path = autocvi.enable_compilation_cache(tmp_path / "cache")
        assert jax.config.jax_compilation_cache_dir == path
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    finally:
        jax.config.update("jax_compilation_cache_dir", old)


def test_constants_inside_sub_jaxprs_never_go_stale():
    """A value JAX keeps inside a custom-derivative body is part of the key."""

    def make(c):
        @jax.custom_jvp
        def g(x):
            return x * c

        g.defjvp(lambda p, t: (g(p[0]), t[0] * c))
        return lambda x: g(x)

    x = jnp.ones(3)
    for c in (np.arange(3.0, dtype=np.float32), np.arange(3.0, dtype=np.float32) + 5):
        np.testing.assert_allclose(structural_jit(make(jnp.asarray(c)))(x), c)


def _regression(X, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ w, 1.0 / jnp.sqrt(tau)), obs=y)


def _data(seed):
    rng = np.random.RandomState(seed)
    X = rng.normal(size=(40, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -0.5, 0.2]) + 0.3 * rng.normal(size=40)).astype(np.float32)
    return {"X": jnp.asarray(X), "y": jnp.asarray(y)}


@pytest.mark.parametrize("rng_key", [0, 3])
@pytest.mark.slow  # default run under budget (session 22)
def test_refit_on_new_data_reuses_the_compiled_loop_and_is_right(rng_key):
    autocvi.fit(_regression, _data(1), progress_bar=False)  # compiles
    before = program_cache_info()
    warm = autocvi.fit(_regression, _data(2), rng_key=rng_key, progress_bar=False)
    after = program_cache_info()
    assert after["misses"] == before["misses"], (before, after)
    assert after["hits"] > before["hits"]
    clear_program_cache()
    cold = autocvi.fit(_regression, _data(2), rng_key=rng_key, progress_bar=False)
    for site in ("w", "tau"):
        np.testing.assert_allclose(
            np.asarray(warm.posterior[site].mean), np.asarray(cold.posterior[site].mean), rtol=1e-5
        )


def test_run_once_programs_compute_the_same_and_are_kept_apart():
    """``runs_once`` compiles at a lower XLA optimisation level: the same values (the oracle is
    the default program), and never served for a default-compiled request or vice versa."""
    clear_program_cache()
    data = jnp.asarray(np.random.RandomState(1).normal(size=50), jnp.float32)
    x = jnp.float32(0.3)
    fast = structural_jit(_closure(data), runs_once=True)(x)
    default = structural_jit(_closure(data))(x)
    for a, b in zip(fast, default):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-6)
    assert program_cache_info()["misses"] == 2

    @structural_jit(runs_once=True)  # the decorator form
    def g(x):
        return _closure(data)(x)

    np.testing.assert_allclose(np.array(g(x)[0]), np.array(default[0]), rtol=1e-6)
    assert program_cache_info()["hits"] == 1


def test_run_once_programs_never_evict_the_loop_program():
    """A fit compiles a few run-once programs per site (its start draws): however many, the
    loop's program must survive for the refit (with one shared cache of 16, a
    stochastic-volatility refit recompiled everything)."""
    clear_program_cache()
    x = jnp.float32(0.7)
    loop = structural_jit(_closure(jnp.ones(5)))
    loop(x)
    for n in range(1, 41):  # 40 distinct run-once programs
        structural_jit(_closure(jnp.ones(n + 5)), runs_once=True)(x)
    before = program_cache_info()["misses"]
    structural_jit(_closure(jnp.zeros(5)))(x)  # a refit: same structure, new data
    assert program_cache_info()["misses"] == before, "the loop program was evicted"


def _wait_for_tier(f, x, optimised: int, seconds: float = 120.0):
    """Call ``f(x)`` until ``optimised`` loop programs run optimised (with more than one core
    the optimised compilation runs in a background thread)."""
    deadline = time.monotonic() + seconds
    while program_cache_info()["optimised"] != optimised and time.monotonic() < deadline:
        f(x)
        time.sleep(0.05)
    return f(x)


def test_loop_programs_start_fast_and_move_to_full_optimisation(monkeypatch):
    """A loop program (not ``runs_once``) compiles first with the short options and, once its
    calls have taken ``TIER_UP_AFTER`` times that compilation, at XLA's default options. Both
    tiers compute what the function run eagerly computes (the oracle)."""
    clear_program_cache()
    data = jnp.asarray(np.random.RandomState(2).normal(size=64), jnp.float32)
    x = jnp.float32(0.3)
    want = _closure(data)(x)
    monkeypatch.setattr(compile_module, "TIER_UP_AFTER", 1e9)  # never pays for itself
    f = structural_jit(_closure(data))
    for _ in range(3):
        fast = f(x)
    info = program_cache_info()
    assert (info["optimised"], info["fast"]) == (0, 1), "moved to the optimised tier without cause"
    monkeypatch.setattr(compile_module, "TIER_UP_AFTER", 0.0)  # every call has paid
    optimised = _wait_for_tier(f, x, optimised=1)
    info = program_cache_info()
    assert (info["optimised"], info["fast"]) == (1, 0), "never moved to the optimised tier"
    for got in (fast, optimised):
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-6)


def test_a_heavy_loop_program_is_optimised_at_once(monkeypatch):
    """A program whose one call moves more than ``FAST_TIER_MAX_BYTES`` (XLA's cost estimate)
    skips the fast tier; a light one does not (completeness of the rule)."""
    clear_program_cache()
    x = jnp.float32(0.3)
    structural_jit(_closure(jnp.ones(7)))(x)
    assert program_cache_info()["optimised"] == 0
    monkeypatch.setattr(compile_module, "FAST_TIER_MAX_BYTES", -1.0)
    data = jnp.ones(8)
    got = structural_jit(_closure(data))(x)
    assert program_cache_info()["optimised"] == 1
    np.testing.assert_allclose(np.array(got[0]), np.array(_closure(data)(x)[0]), rtol=1e-6)


def test_a_failed_optimised_compilation_leaves_the_fast_program_running(monkeypatch):
    """The optimised compilation is a speed-up only: if it raises (memory, an XLA bug), the
    fit goes on with the fast program's values instead of failing."""
    clear_program_cache()
    data = jnp.asarray(np.random.RandomState(3).normal(size=32), jnp.float32)
    x = jnp.float32(0.3)
    compile_for = compile_module._compile

    def failing(lowered, options):
        if not options:
            raise RuntimeError("the optimised compilation failed")
        return compile_for(lowered, options)

    monkeypatch.setattr(compile_module, "_compile", failing)
    monkeypatch.setattr(compile_module, "TIER_UP_AFTER", 0.0)
    f = structural_jit(_closure(data))
    for _ in range(5):
        got = f(x)
        time.sleep(0.05)
    assert program_cache_info()["optimised"] == 0
    np.testing.assert_allclose(np.array(got[0]), np.array(_closure(data)(x)[0]), rtol=1e-6)


def test_a_loop_program_called_inside_a_callers_jit_is_inlined():
    """A user may wrap a step in their own ``jax.jit`` (as with ``SVI.update``)."""
    clear_program_cache()
    data = jnp.ones(6)
    f = structural_jit(_closure(data))
    got = jax.jit(lambda x: f(x)[0] * 2.0)(jnp.float32(0.3))
    np.testing.assert_allclose(float(got), 2.0 * float(_closure(data)(0.3)[0]), rtol=1e-6)


def test_compile_options_this_xla_does_not_know_are_dropped():
    """XLA's debug options come and go between releases: an unknown one is left out (a
    missing option costs speed, never a fit)."""
    options = {"xla_backend_optimization_level": 0, "xla_no_such_option_in_any_release": True}
    assert compile_module._supported(options) == {"xla_backend_optimization_level": 0}


def _eight_schools():
    y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0], np.float32)
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0], np.float32)

    def model(y, sigma):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("J", 8):
            theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
            numpyro.sample("obs", dist.Normal(mu + tau * theta, sigma), obs=y)

    return model, {"y": y, "sigma": sigma}


def test_every_chunk_of_a_fit_runs_one_loop_program(monkeypatch):
    """The loop's chunks and the iterate averaging after them (Monte Carlo messages)
    call the same chunk runner: they must pass the same input types, or the whole loop
    program compiles again (a weakly typed history once cost 6 s of a 14 s cold fit)."""
    fit_module = importlib.import_module("autocvi.infer.fit")
    build = fit_module._chunk_runner
    signatures = []

    def recording(*args, **kwargs):
        runner = build(*args, **kwargs)

        def run(state, history, remaining, hold):
            signatures.append(tuple(str(jax.typeof(x)) for x in (history, remaining, hold)))
            return runner(state, history, remaining, hold)

        return run

    monkeypatch.setattr(fit_module, "_chunk_runner", recording)
    model, data = _eight_schools()
    result = autocvi.fit(model, data, progress_bar=False, check=False)
    assert not result.schedule.deterministic  # Monte Carlo messages: the averaging runs
    assert len(signatures) >= 2 and len(set(signatures)) == 1, signatures
