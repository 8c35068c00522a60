"""The exact SVGP conditional in float32, the precision users get by default (issue 15).

The float64 oracles are in ``test_sparse_gp.py``; here the same Bernoulli SVGP, with f
integrated into y's expectation, reaches the optimum of the direct maximisation of the
SVGP ELBO to float32 accuracy, and the rule's estimates do not depend on x64.
"""

import warnings

import numpy as np
import pytest
from test_sparse_gp import (  # noqa: E402
    svgp,
    svgp_classification_learned,
    svgp_classification_optimum,
    svgp_inputs,
)

import autocvi
from autocvi.infer.convergence import FitWarning


def test_float32_classification_reaches_the_svgp_optimum():
    inputs = svgp_inputs(n=100, m=10, classify=True)
    inputs = {k: np.asarray(v, np.float32) for k, v in inputs.items()}
    inputs["likelihood"] = "bernoulli"
    result = autocvi.fit(svgp, inputs, progress_bar=False)
    assert [it.latent for it in result.schedule.integrated] == ["f"]
    assert result.converged
    mean, cov, elbo = svgp_classification_optimum(
        *(np.asarray(inputs[k], np.float64) for k in ("Kuu", "Kfu", "kff", "y"))
    )
    q = result.posterior["u"]
    sd = np.sqrt(np.diag(cov))
    assert np.max(np.abs(np.asarray(q.mean) - mean) / sd) < 0.02
    assert np.max(np.abs(np.sqrt(np.diag(np.asarray(q.covariance_matrix))) / sd - 1)) < 0.02
    assert result.elbo[-1] == pytest.approx(elbo, abs=0.01)


def minibatched_svgp(Kuu, Kfu, y=None, B=None):
    """The SVGP conditional inside a subsampled data plate (a user's minibatch SVGP)."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Kuu.shape[0]), Kuu))
    with numpyro.plate("data", Kfu.shape[0], subsample_size=B) as idx:
        K = jnp.asarray(Kfu)[idx]
        A = jnp.linalg.solve(Kuu, K.T).T
        residual = jnp.clip(1.0 - jnp.sum(A * K, -1), 1e-6)
        f = numpyro.sample("f", dist.Normal(A @ u, jnp.sqrt(residual)))
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=jnp.asarray(y)[idx])


@pytest.mark.slow  # CI runs it; the default run stays under 10 minutes
def test_a_minibatched_svgp_says_converged_only_near_the_full_batch_answer():
    """Soundness of the stochastic stopping rule: the minibatch ELBO's noise hid the
    trend and the fit said converged 0.9 posterior sd short of the full-batch q(u);
    q's movement between chunks now has to vanish too."""
    from test_sparse_gp import kernel

    rng = np.random.default_rng(0)
    n, m = 1000, 12
    x = np.sort(rng.uniform(-3, 3, n))
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-3 * np.sin(2 * x)))).astype(np.float32)
    z = np.linspace(-3, 3, m)
    data = dict(Kuu=kernel(z, z) + 1e-4 * np.eye(m), Kfu=kernel(x, z), y=y)
    full = autocvi.fit(minibatched_svgp, data, progress_bar=False)
    assert full.converged
    with warnings.catch_warnings():  # a not-converged fit warns: that is allowed here
        warnings.simplefilter("ignore", FitWarning)
        # the plain N/B-scaled message (no site memory): the noisy path the rule guards
        mb = autocvi.fit(
            minibatched_svgp,
            {**data, "B": 100},
            num_steps=200,
            progress_bar=False,
            site_memory=False,
        )
    assert [it.latent for it in mb.schedule.integrated] == ["f"]
    sd = np.sqrt(np.diag(np.asarray(full.posterior["u"].covariance_matrix)))
    error = np.max(np.abs(np.asarray(mb.posterior["u"].mean - full.posterior["u"].mean)) / sd)
    assert not mb.converged or error < 0.3, (mb.converged, error)


@pytest.mark.slow  # CI runs it; the default run stays under 10 minutes
def test_a_large_joint_gaussian_does_not_keep_an_svgp_from_being_integrated():
    """An SVGP with a learned kernel (so u and f would share a joint Gaussian) on 4-d
    inputs. The integrated gap is above NEGLIGIBLE_GAP in both (about 0.06 nat per element):
    with 110 points + 10 inducing values the joint Gaussian q(u,f) is kept (soundness:
    small joint Gaussians still win); with 300 points it would hold 310 values, a dense
    cubic step per iteration, and f is integrated (completeness)."""
    from autocvi.analysis.integrate import LARGE_JOINT, NEGLIGIBLE_GAP

    rng = np.random.default_rng(0)
    decisions = {}
    for n in (300, 120):
        X = rng.normal(size=(n, 4))
        y = (rng.uniform(size=n) < 0.5).astype(float)
        schedule = autocvi.plan(svgp_classification_learned, dict(X=X, Z=X[:10], y=y))
        decisions[n] = (list(schedule.nodes), schedule.integrated)
    assert 120 + 10 <= LARGE_JOINT < 300 + 10
    assert decisions[120][0] == ["q(u,f)"] and not decisions[120][1]
    assert decisions[300][0] == ["u"]
    (it,) = decisions[300][1]
    assert NEGLIGIBLE_GAP < it.gap_integrated < it.gap_mean_field
