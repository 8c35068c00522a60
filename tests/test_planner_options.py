"""Planner options (``autocvi.PLANNER_OPTIONS``) through ``autocvi.CVI``, ``autocvi.fit`` and
``autocvi.plan``: passed through to the planner, kept when ``CVI`` plans again, and an
unknown name is a ``TypeError`` that names it and lists the valid ones.

Oracle for ``use_quadrature=False``: the schedule's message kinds (Monte Carlo where
Gauss-Hermite ones are planned by default), and ``CVI`` and ``fit`` giving the same q.
"""

import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from test_api import indexed_walk  # counts on a walk read through an index array

import autocvi


def logistic(X, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def _data(seed, n=30, d=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    return {"X": X, "y": (X @ np.array([1.5, -1.0, 0.5]) > 0).astype(np.float32)}


def _kinds(schedule):
    return {k for node in schedule.nodes.values() for _, k in node.incoming}


@pytest.mark.slow  # CI runs it; the default run stays under 10 minutes
def test_use_quadrature_false_reaches_the_planner_through_cvi_and_fit():
    data = _data(0)
    assert "gauss-hermite" in _kinds(autocvi.plan(logistic, data))  # the default
    cvi = autocvi.CVI(logistic, use_quadrature=False)
    state = cvi.init(0, **data)
    assert _kinds(cvi.get_schedule(state)) == {"exact", "monte-carlo"}
    # tol=0: every iteration, no early stop (whose iterate average would differ from
    # CVI.run); one chunk of 20: programs compiled differently (fit's loop also tracks q)
    # round differently, and Monte Carlo line searches amplify that over later chunks.
    result = autocvi.fit(
        logistic, data, use_quadrature=False, num_steps=20, tol=0, progress_bar=False
    )
    assert _kinds(result.schedule) == {"exact", "monte-carlo"}
    # CVI.run and fit run the same plan and step from the same key: the same q (to the
    # rounding the two compiled programs differ by, which the Monte Carlo line searches
    # amplify once the ELBO is flat: 4e-4 relative by iteration 10)
    run = cvi.run(0, 20, **data)
    np.testing.assert_allclose(run.elbo[:10], result.elbo[:10], rtol=1e-5)
    np.testing.assert_allclose(run.elbo, result.elbo[: run.elbo.size], rtol=1e-3)
    q_cvi, q_fit = cvi.get_posterior(run.state)["w"], result.posterior["w"]
    np.testing.assert_allclose(q_cvi.mean, q_fit.mean, rtol=1e-3, atol=1e-4)


def _walk_data(permuted):
    y = np.random.RandomState(0).poisson(3.0, size=12).astype(np.float32)
    idx = np.random.RandomState(1).permutation(12) if permuted else np.arange(12)
    return {"idx": idx, "y": y}


def test_options_are_kept_when_cvi_plans_again_for_new_data():
    cvi = autocvi.CVI(logistic, step_size_decay=0.5)
    first = cvi.init(0, **_data(0))
    state, _ = cvi.update(first, **_data(1))
    assert state.plan == first.plan  # a block reads new data without planning again
    cvi = autocvi.CVI(indexed_walk, step_size_decay=0.5)
    first = cvi.init(0, **_walk_data(False))
    state, _ = cvi.update(first, **_walk_data(True))
    assert state.plan != first.plan  # planned again
    assert cvi.get_schedule(first).blocks
    for s in (first, state):
        assert cvi.get_schedule(s).step_size_decay == 0.5
    cvi = autocvi.CVI(logistic, gaussian_blocks=False)
    assert not cvi.get_schedule(cvi.init(0, **_data(0))).blocks


@pytest.mark.parametrize(
    "option", [{"precondition": False}, {"integrate_conditionals": False}, {"joint_sites": ()}]
)
def test_options_plan_decides_itself_survive_a_re_plan_for_new_data(option):
    """plan() settles these before build_schedule; CVI's re-plan for new data (here: new
    data that break a Gaussian block's structure) passed them on to build_schedule,
    which raised a TypeError."""
    cvi = autocvi.CVI(indexed_walk, **option)
    first = cvi.init(0, **_walk_data(False))
    state = cvi.init(0, **_walk_data(True))  # new values, same shapes: re-planned
    assert state.plan != first.plan


@pytest.mark.parametrize(
    "call",
    [
        lambda: autocvi.CVI(logistic, use_quadature=False),
        lambda: autocvi.fit(logistic, _data(0), use_quadature=False, progress_bar=False),
        lambda: autocvi.plan(logistic, _data(0), use_quadature=False),
    ],
    ids=["CVI", "fit", "plan"],
)
def test_an_unknown_option_names_itself_and_the_valid_ones(call):
    with pytest.raises(TypeError) as err:
        call()
    message = str(err.value)
    assert "'use_quadature'" in message and "did you mean 'use_quadrature'" in message
    for name in autocvi.PLANNER_OPTIONS:
        assert name in message


def test_fit_refuses_an_unknown_option_before_tracing(monkeypatch):
    from autocvi.plan import schedule

    monkeypatch.setattr(schedule, "trace", lambda *a, **k: pytest.fail("traced"))
    with pytest.raises(TypeError, match="'num_particles'"):
        autocvi.fit(logistic, _data(0), num_particles=4)
