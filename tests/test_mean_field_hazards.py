"""A fit that had to use an approximation known to go far wrong says so (soundness),
and one that did not, does not (completeness).

The case: a multiclass sparse GP written with the exact SVGP conditional for the latent
function values, ``f_n ~ N(A_n u, s_n)`` with C classes per data point, and
``y_n ~ Categorical(logits=f_n)``. The likelihood reads C elements of f per
observation, so the rule that integrates f (q(u) p(f | u)) cannot fire; f keeps a
mean-field q, which collapses q(u) through the tight conditional. Found on scikit-learn's
digits (10 classes, m = 100): ``converged=True`` at chance accuracy. Here: iris, 3
classes, m = 10.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from sklearn.datasets import load_iris

import autocvi
from autocvi.infer.convergence import FitWarning

M = 10


def iris():
    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    Z = X[np.random.RandomState(0).permutation(len(y))[:M]]
    return jnp.asarray(X, jnp.float32), jnp.asarray(y), jnp.asarray(Z, jnp.float32)


def kernel(A, B, lengthscale=1.5):
    d = (A[:, None, :] - B[None, :, :]) / lengthscale
    return jnp.exp(-0.5 * jnp.sum(d**2, -1))


def conditional(X, Z):
    Kuu = kernel(Z, Z) + 1e-5 * jnp.eye(Z.shape[0])
    Kfu = kernel(X, Z)
    A = jnp.linalg.solve(Kuu, Kfu.T).T
    return Kuu, A, jnp.clip(1.0 - jnp.sum(A * Kfu, -1), 1e-6)


def multiclass_svgp(X, Z, y=None):
    Kuu, A, residual = conditional(X, Z)
    with numpyro.plate("classes", 3):
        u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Z.shape[0]), Kuu))
    with numpyro.plate("data", X.shape[0]):
        f = numpyro.sample("f", dist.Normal(A @ u.T, jnp.sqrt(residual)[:, None]).to_event(1))
        numpyro.sample("y", dist.Categorical(logits=f), obs=y)


def binary_svgp(X, Z, y=None):
    Kuu, A, residual = conditional(X, Z)
    u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Z.shape[0]), Kuu))
    with numpyro.plate("data", X.shape[0]):
        f = numpyro.sample("f", dist.Normal(A @ u, jnp.sqrt(residual)))
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def test_a_multiclass_svgp_with_latent_f_is_reported_as_untrustworthy():
    X, y, Z = iris()
    data = {"X": X, "Z": Z, "y": y}
    schedule = autocvi.plan(multiclass_svgp, data)
    (hazard,) = schedule.hazards
    assert "'y' (CategoricalLogits) reads several elements of f" in hazard
    assert "mean-field" in hazard and "deterministic" in hazard
    assert "WARNING: f's conditional" in str(schedule)


@pytest.mark.slow
def test_the_fit_of_that_model_says_it_is_untrustworthy():
    X, y, Z = iris()
    data = {"X": X, "Z": Z, "y": y}
    hazard = autocvi.plan(multiclass_svgp, data).hazards[0]
    with pytest.warns(FitWarning, match="far from the optimum: f's conditional"):
        result = autocvi.fit(multiclass_svgp, data, num_steps=3, progress_bar=False)
    assert not result.converged and result.diagnostics.hazards == [hazard]


def test_an_svgp_whose_f_is_integrated_or_grouped_has_no_hazard():
    X, y, Z = iris()
    binary = {"X": X, "Z": Z, "y": (y == 0).astype(jnp.float32)}
    schedule = autocvi.plan(binary_svgp, binary)
    assert schedule.integrated and schedule.hazards == ()
    # Forced mean-field in the binary case: the planner's own choice, no structural hazard
    # (the child reads one element of f per observation).
    schedule = autocvi.plan(binary_svgp, binary, integrate_conditionals=False)
    assert not schedule.integrated and schedule.hazards == ()
