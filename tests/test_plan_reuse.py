"""A second plan of the same model (a refit, ``fit`` after ``plan``) reuses what does not
depend on the data values (issue 14): the model is run eagerly once per traced graph, not once
per latent, and conjugacy verdicts are kept by (jaxpr, constants, example values).

Soundness: new data that change a verdict change it (the oracle is a plan with the verdict
cache emptied). Completeness: the same model and data do not re-run the analysis.
"""

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import pytest

import autocvi
from autocvi.analysis.conjugacy import verdict as V


def _counting_model(calls):
    def model(x, y=None):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        s = numpyro.sample("s", dist.HalfNormal(1.0))
        calls["traced" if isinstance(a, jax.core.Tracer) else "eager"] += 1
        with numpyro.plate("n", x.shape[0]):
            numpyro.sample("y", dist.Normal(a + b * x, s), obs=y)

    return model


def test_the_model_runs_eagerly_once_per_traced_graph():
    """Three latents coupled into one joint group: the user's graph and the joint graph are
    traced (one eager run each) and the start chooses among prior candidates (one more).
    Before, the layouts and the joint groups re-ran the model once per latent (14 runs)."""
    calls = {"eager": 0, "traced": 0}
    x = jnp.linspace(-1.0, 1.0, 20)
    schedule = autocvi.plan(_counting_model(calls), {"x": x, "y": 0.5 + 2.0 * x})
    assert schedule.joint, "the test needs a joint group (two traced graphs)"
    assert calls["eager"] == 3, calls


def _flagged_model(flag, y=None):
    """``mu`` enters the mean linearly where ``flag`` is set, through exp elsewhere: the
    likelihood is conjugate to a Normal q on mu exactly when every flag is set."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("n", flag.shape[0]):
        numpyro.sample("y", dist.Normal(jnp.where(flag, mu, jnp.exp(mu)), 1.0), obs=y)


def _verdict(flag, y):
    graph = autocvi.trace(_flagged_model, {"flag": flag, "y": y})
    return graph.edges[("y", "mu")].conjugate


@pytest.mark.parametrize("order", ["conjugate first", "non-conjugate first"])
def test_verdicts_follow_the_data_values(monkeypatch, order):
    y = jnp.linspace(-1.0, 1.0, 6)
    all_set, one_unset = jnp.ones(6, bool), jnp.ones(6, bool).at[2].set(False)
    flags = [all_set, one_unset] if order == "conjugate first" else [one_unset, all_set]
    got = [_verdict(f, y) for f in flags]
    V._VERDICTS.clear()  # the oracle: each verdict computed afresh
    want = [_verdict(f, y) for f in flags[::-1]][::-1]
    assert got == want
    assert sorted(got) == [False, True]


def test_a_second_trace_reuses_the_verdicts(monkeypatch):
    y = jnp.linspace(-1.0, 1.0, 6)
    calls = []
    analyse = V._classify_uncached
    monkeypatch.setattr(V, "_classify_uncached", lambda *a: calls.append(a) or analyse(*a))
    V._VERDICTS.clear()
    first = _verdict(jnp.ones(6, bool), y)
    assert calls, "the first trace analyses the edge"
    calls.clear()
    assert _verdict(jnp.ones(6, bool), y) == first
    assert not calls, "the same model and data analysed again"
    _verdict(jnp.ones(6, bool), y + 1.0)  # new observations: new constants, analysed again
    assert calls
