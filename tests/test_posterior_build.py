"""The compiled programs of a fit (posterior build, final iterate average) against their eager oracles."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autocvi

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_monte_carlo_messages import regression  # noqa: E402  (the same user model)

from autocvi.infer.fit import _posterior_of, posterior_of


@pytest.mark.slow  # CI runs it; the default run stays well under 10 minutes
def test_compiled_posterior_equals_the_eager_build_in_the_models_order():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -1.0, 0.5]) + 0.3 + 0.5 * rng.normal(size=50)).astype(np.float32)
    r = autocvi.fit(regression, {"X": jnp.asarray(X), "y": jnp.asarray(y)}, progress_bar=False)
    compiled = posterior_of(r.schedule, r.state)
    eager = _posterior_of(r.schedule, r.state.natural)
    assert list(compiled) == list(eager) == ["b", "w", "sigma"]
    for name, q in eager.items():
        assert type(compiled[name]) is type(q)
        a, b = (
            compiled[name].sample(jax.random.PRNGKey(0), (3,)),
            q.sample(jax.random.PRNGKey(0), (3,)),
        )
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(compiled[name].log_prob(b), q.log_prob(b), rtol=1e-4, atol=1e-4)


def test_an_ill_conditioned_q_still_raises_the_error_that_names_the_fix():
    """The compiled build skips NumPyro's eager validation; its own positive-definiteness
    check must send an ill-conditioned q to the eager build, which raises. The q is
    made so directly: the zoo's uncentred-year regression fitted in float32 without
    preconditioning reaches it or a collapsed variance (which warns) depending on the
    rounding of whichever program ran, so a fit cannot decide the test."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -1.0, 0.5]) + 0.3 + 0.5 * rng.normal(size=50)).astype(np.float32)
    r = autocvi.fit(regression, {"X": jnp.asarray(X), "y": jnp.asarray(y)}, progress_bar=False)
    (group,) = r.state.natural
    lam1, lam2 = r.state.natural[group]
    # intercept and slope correlated at -0.99999999: positive definite, not in float32
    covariance = np.eye(lam1.shape[0])
    covariance[0, 1] = covariance[1, 0] = -0.99999999
    precision = np.linalg.inv(covariance).astype(lam2.dtype)
    bad = r.state._replace(natural={group: (lam1, jnp.asarray(-0.5 * precision))})
    with pytest.raises(autocvi.IllConditionedError, match="x64"):
        posterior_of(r.schedule, bad)
    # the well-conditioned q it came from builds
    assert set(posterior_of(r.schedule, r.state)) == {"b", "w", "sigma"}


@pytest.mark.slow  # default run under budget (session 22)
def test_compiled_posterior_validates_its_arguments_as_numpyro_does_by_default():
    """The program is traced with validation off (NumPyro's checks cannot run on
    tracers and cost a compile per mask); the distributions handed to the user must
    still validate as NumPyro's default says: out-of-support values warn or raise."""
    import numpyro.distributions as dist

    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -1.0, 0.5]) + 0.5 * rng.normal(size=40)).astype(np.float32)
    r = autocvi.fit(regression, {"X": jnp.asarray(X), "y": jnp.asarray(y)}, progress_bar=False)
    for name, q in posterior_of(r.schedule, r.state).items():
        inner = q
        while inner is not None:
            assert inner._validate_args == dist.Distribution._validate_args, name
            inner = getattr(inner, "base_dist", None)
    # and validation really runs: sigma's q has positive support
    if dist.Distribution._validate_args:
        with pytest.warns(UserWarning, match="Out-of-support"):
            posterior_of(r.schedule, r.state)["sigma"].log_prob(-1.0)


def test_final_iterate_average_by_the_loop_program_equals_average_iterates():
    """``fit`` averages the last iterates with the compiled chunk runner (so the step is
    compiled once); the oracle is :func:`average_iterates`, the plain scan that sums the
    natural parameters after each of 2 * WINDOW steps."""
    from autocvi.engine.step import cvi
    from autocvi.infer.fit import (
        _WINDOW,
        _chunk_average,
        _chunk_runner,
        _natural,
        average_iterates,
    )

    rng = np.random.default_rng(2)
    X = rng.normal(size=(40, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -1.0, 0.5]) + 0.5 * rng.normal(size=40)).astype(np.float32)
    r = autocvi.fit(regression, {"X": jnp.asarray(X), "y": jnp.asarray(y)}, progress_bar=False)
    algorithm = cvi(r.schedule)
    assert not r.schedule.deterministic  # Monte Carlo messages: averaging applies
    runner = _chunk_runner(algorithm.step, 1e-4, False, False, _natural)
    got = _chunk_average(runner, r.state)
    want = average_iterates(algorithm.step, r.state, 2 * _WINDOW)
    moved = False
    for a, b, start in zip(
        jax.tree_util.tree_leaves(got.natural),
        jax.tree_util.tree_leaves(want.natural),
        jax.tree_util.tree_leaves(r.state.natural),
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        moved = moved or not np.allclose(np.asarray(a), np.asarray(start), rtol=1e-6, atol=0)
    assert moved  # the average is over new iterates, not the state handed in
