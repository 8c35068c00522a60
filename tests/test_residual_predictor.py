"""An integrated conditional's residual is one more Gaussian in the predictor (issue 15).

With f integrated into its child (q(u) p(f | u), as SVGP), the child's messages to u
are expectations over eta = a^T u + s e with e ~ N(0, 1) independent of u, so one 1-D
rule over the total variance a^T S a + s^2 replaces an outer rule over an inner one.
The planner keeps the residual apart (``LinearPredictor.point_fn`` and
``residual_var_fn``); these tests check the pieces against an independent computation
(scipy quadrature of the marginal of f) and that the split is refused when eta does not
read the residual element by element.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from scipy import integrate
from test_sparse_gp import svgp, svgp_inputs

import autocvi
from autocvi.analysis.integrate import residual_predictor


def test_the_classifiers_predictor_keeps_the_residual_and_gives_the_marginal_expectation():
    inputs = svgp_inputs(n=30, m=6, classify=True)
    inputs["likelihood"] = "bernoulli"
    schedule = autocvi.plan(svgp, inputs)
    assert [it.latent for it in schedule.integrated] == ["f"]
    lp = schedule.factors["y"].linear_predictors["u"]
    assert lp.point_fn is not None  # completeness: the SVGP spelling gets the 1-D rule
    Kuu, Kfu, kff, y = (np.asarray(inputs[k], float) for k in ("Kuu", "Kfu", "kff", "y"))
    A = np.linalg.solve(Kuu, Kfu.T).T
    residual = np.maximum(kff - np.sum(A * Kfu, -1), 1e-10)
    params = {k: v for k, v in schedule.graph.example_values.items() if k != "u"}
    rest, extra = lp.point_rest(params)
    np.testing.assert_allclose(np.asarray(extra), residual, rtol=1e-5, atol=1e-7)

    # a q(u) away from the prior, and the expected log likelihood per element
    rng = np.random.default_rng(0)
    m = rng.normal(size=6)
    L = np.tril(rng.normal(size=(6, 6))) * 0.3 + np.eye(6) * 0.5
    S = L @ L.T
    eta_mean = np.asarray(lp.eta_fn({**params, "u": jnp.asarray(m)}))
    np.testing.assert_allclose(eta_mean, A @ m, rtol=1e-6, atol=1e-8)
    var = np.einsum("nd,de,ne->n", A, S, A) + np.asarray(extra)
    nodes, weights = np.polynomial.hermite_e.hermegauss(32)
    eta = eta_mean[None] + np.sqrt(var)[None] * nodes[:, None]
    ours = np.tensordot(weights / np.sqrt(2 * np.pi), np.asarray(jax.vmap(rest)(eta)), 1)

    def oracle(n):  # E_{f ~ N(a^T m, a^T S a + r)} log Bernoulli(y_n | sigmoid(f))
        sd = np.sqrt(var[n])

        def integrand(f):
            logp = -np.logaddexp(0.0, -f) if y[n] else -np.logaddexp(0.0, f)
            return logp * np.exp(-0.5 * ((f - eta_mean[n]) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))

        return integrate.quad(integrand, eta_mean[n] - 12 * sd, eta_mean[n] + 12 * sd)[0]

    np.testing.assert_allclose(ours, [oracle(n) for n in range(len(y))], rtol=1e-6, atol=1e-8)
    # the integrated child's own rest_fn (an inner rule) agrees with the 1-D one
    nested = np.tensordot(
        weights / np.sqrt(2 * np.pi),
        np.asarray(
            jax.vmap(lambda e: lp.rest_fn(e, params))(
                eta_mean[None] + np.sqrt(var - extra)[None] * nodes[:, None]
            )
        ),
        1,
    )
    np.testing.assert_allclose(nested, ours, rtol=1e-6, atol=1e-8)


def _child(mix: bool):
    """A Bernoulli child of f = A u + s e, with e read element by element or mixed."""
    A = jnp.asarray(np.random.default_rng(1).normal(size=(5, 3)))
    s = jnp.linspace(0.5, 1.5, 5)
    y = jnp.asarray([0.0, 1.0, 1.0, 0.0, 1.0])

    def log_density(values):
        e = values["e"]
        noise = jnp.cumsum(s * e) if mix else s * e
        return dist.Bernoulli(logits=A @ values["u"] + noise).log_prob(y)

    return log_density, s


@pytest.mark.parametrize("mix", [False, True])
def test_the_split_needs_a_residual_read_element_by_element(mix):
    log_density, s = _child(mix)
    example = {"u": jnp.zeros(3), "e": jnp.zeros(5)}
    lp = residual_predictor(log_density, example, "u", "e")
    if mix:  # soundness: a residual mixed across elements is not one variance per element
        assert lp is None
    else:  # completeness
        assert lp is not None
        np.testing.assert_allclose(np.asarray(lp.residual_var_fn({})), np.asarray(s) ** 2)
