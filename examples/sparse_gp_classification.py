"""Sparse GP classification written as SVGP users write it (banana data, m = 10).

Inducing values ``u ~ MultivariateNormal(0, Kuu)`` and, inside the data plate, the
exact SVGP conditional ``f_i ~ Normal(k_i^T Kuu^-1 u, sqrt(k_ii - q_ii))`` and the
likelihood. autocvi's planner integrates ``f`` into the likelihood's expectation,
q(u) p(f | u) as SVGP (``plan()`` prints a note saying so and why), and learns the
kernel's amplitude and length-scale by variational EM whose M-steps hold the
likelihood's sites on f while the kernel moves (Chang, Khan & Solin, *Dual
Parameterization of Sparse Variational Gaussian Processes*, Eq. 15).

    python examples/sparse_gp_classification.py
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

import autocvi

JITTER = 1e-6


def kernel(amplitude, lengthscale, a, b):
    d2 = jnp.sum((a[:, None] - b[None]) ** 2, -1)
    return amplitude**2 * jnp.exp(-0.5 * d2 / lengthscale**2)


def svgp(X, Z, y=None):
    amplitude = numpyro.param("amplitude", 1.0, constraint=constraints.positive)
    lengthscale = numpyro.param("lengthscale", 1.0, constraint=constraints.positive)
    Kuu = kernel(amplitude, lengthscale, Z, Z) + JITTER * jnp.eye(Z.shape[0])
    Kfu = kernel(amplitude, lengthscale, X, Z)
    A = jnp.linalg.solve(Kuu, Kfu.T).T
    residual = jnp.clip(amplitude**2 - jnp.sum(A * Kfu, -1), 1e-10)  # k_ii - q_ii
    u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Z.shape[0]), Kuu))
    with numpyro.plate("data", X.shape[0]):
        f = numpyro.sample("f", dist.Normal(A @ u, jnp.sqrt(residual)))
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def banana(num_inducing=10, seed=0):
    """The banana toy, standardised, and ``num_inducing`` of its inputs as inducing inputs."""
    data = autocvi.datasets.load("banana")
    X = (data["X"] - data["X"].mean(0)) / data["X"].std(0)
    Z = X[np.random.default_rng(seed).choice(len(X), num_inducing, replace=False)]
    return X, Z, np.asarray(data["y"], float)


def main():
    jax.config.update("jax_enable_x64", True)
    X, Z, y = banana()
    inputs = {"X": X, "Z": Z, "y": y}
    print(autocvi.trace(svgp, inputs))
    print(autocvi.plan(svgp, inputs))
    start = time.perf_counter()
    result = autocvi.fit(svgp, inputs, progress_bar=False)
    print(
        f"\n{result.em.rounds} EM rounds, {result.num_steps} CVI iterations, "
        f"{time.perf_counter() - start:.1f} s; converged: {result.converged}"
    )
    print("learned:", {k: round(float(v), 4) for k, v in result.params.items()})
    print("ELBO (the SVGP bound):", round(float(result.elbo[-1]), 4))
    q_f = result.posterior["f"]
    accuracy = np.mean((np.asarray(q_f.mean) > 0) == (y > 0.5))
    print(f"training accuracy of sign(E f): {accuracy:.3f}")


if __name__ == "__main__":
    main()
