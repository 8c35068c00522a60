"""BUGS-style vague priors in float32 (the precision users get by default).

``tau ~ Gamma(eps, eps)`` with eps = 0.01 or 0.001 has ``E[log tau]`` of -96 to -1000:
its moment nodes underflow in float32, and a fit that starts q at the prior got a NaN
ELBO, refused every step and returned q(tau) = the prior (loudly, with a misleading
message). Oracle: the mean-field VMP fixed point in closed form, iterated in numpy
float64 (``q(mu) = N``, ``q(tau) = Gamma``; Bishop, PRML 10.1.3, with independent
priors)."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import autocvi

PRIOR_SD = 10.0


def normal_unknown_precision(z, eps):
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    tau = numpyro.sample("tau", dist.Gamma(eps, eps))
    with numpyro.plate("N", z.shape[0]):
        numpyro.sample("z", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=z)


def vmp_fixed_point(z, eps, iterations=500):
    n, e_tau = len(z), 1.0
    for _ in range(iterations):
        precision = 1.0 / PRIOR_SD**2 + n * e_tau
        m, s2 = e_tau * z.sum() / precision, 1.0 / precision
        a, b = eps + n / 2, eps + 0.5 * np.sum((z - m) ** 2 + s2)
        e_tau = a / b
    return m, s2, e_tau


@pytest.mark.parametrize("eps", [0.01, 0.001])
def test_vague_gamma_precision_in_float32(eps):
    z = np.random.RandomState(1).normal(1.0, 1.0, 48)
    result = autocvi.fit(normal_unknown_precision, {"z": z, "eps": eps}, progress_bar=False)
    m, s2, e_tau = vmp_fixed_point(z, eps)
    assert result.converged and np.isfinite(result.elbo_final)
    assert float(result.posterior["mu"].mean) == pytest.approx(m, rel=1e-4)
    assert float(result.posterior["mu"].variance) == pytest.approx(s2, rel=1e-3)
    assert float(result.posterior["tau"].mean) == pytest.approx(e_tau, rel=1e-4)
