"""A sparse GP classifier on 100,000 points with minibatches, written as SVGP users write it.

Inducing values ``u ~ MultivariateNormal(0, Kuu)`` at m = 50 inputs and, inside a data
plate subsampled to B = 1,000 points a step, the exact SVGP conditional
``f_i ~ Normal(k_i^T Kuu^-1 u, sqrt(k_ii - q_ii))`` and a Bernoulli likelihood. The kernel
is fixed here. autocvi integrates f into the likelihood's expectation (q(u) p(f | u),
as SVGP) and keeps one Gaussian site per data point for the likelihood's message to u
(2 numbers a point, the O(N) memory of Khan et al.'s PG-SVI GP update, Eq. 19): every
step refreshes the batch's sites and sends u the SAG estimate of the full-data
message, so a constant step reaches the full-data optimum instead of hovering around
it. ``plan()`` prints both decisions. The data are synthetic (a smooth latent function
of two inputs), drawn here: no download.

    python examples/minibatch_sparse_gp.py
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import autocvi

AMPLITUDE, LENGTHSCALE, JITTER = 2.0, 0.6, 1e-4


def kernel(a, b):
    d2 = jnp.sum((a[:, None] - b[None]) ** 2, -1)
    return AMPLITUDE**2 * jnp.exp(-0.5 * d2 / LENGTHSCALE**2)


def svgp(X, Z, y=None, batch_size=None):
    Kuu = kernel(Z, Z) + JITTER * jnp.eye(Z.shape[0])
    u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Z.shape[0]), Kuu))
    with numpyro.plate("data", X.shape[0], subsample_size=batch_size) as idx:
        Kfu = kernel(jnp.asarray(X)[idx], Z)
        A = jnp.linalg.solve(Kuu, Kfu.T).T
        residual = jnp.clip(AMPLITUDE**2 - jnp.sum(A * Kfu, -1), 1e-6)  # k_ii - q_ii
        f = numpyro.sample("f", dist.Normal(A @ u, jnp.sqrt(residual)))
        numpyro.sample(
            "y", dist.Bernoulli(logits=f), obs=None if y is None else jnp.asarray(y)[idx]
        )


def latent(X):
    return 2.0 * np.sin(2.0 * X[:, 0]) * np.cos(1.5 * X[:, 1]) + X[:, 1]


def make_data(n, seed=0):
    """``n`` inputs uniform on [-2, 2]^2 and labels from the latent function's logits."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 2.0, (n, 2)).astype(np.float32)
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-latent(X)))).astype(np.float32)
    return X, y


def inducing_inputs(X, m, seed=0):
    return X[np.random.default_rng(seed).choice(len(X), m, replace=False)]


def test_nlpd(u_mean, u_cov, Z, X, y, nodes=32):
    """Mean negative log predictive density of labels ``y`` at ``X`` under
    q(u) p(f | u), q(u) = N(``u_mean``, ``u_cov``)."""
    Kuu = kernel(Z, Z) + JITTER * jnp.eye(Z.shape[0])
    Kfu = kernel(jnp.asarray(X), Z)
    A = jnp.linalg.solve(Kuu, Kfu.T).T
    mean = A @ u_mean
    var = jnp.sum((A @ u_cov) * A, -1) + AMPLITUDE**2 - jnp.sum(A * Kfu, -1)
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    f = mean[:, None] + jnp.sqrt(jnp.maximum(var, 1e-12))[:, None] * x[None]
    sign = (2.0 * jnp.asarray(y) - 1.0)[:, None]
    p = jnp.sum(w / np.sqrt(2 * np.pi) * jax.nn.sigmoid(sign * f), -1)
    return -jnp.mean(jnp.log(p))


def main(n=100_000, m=50, batch_size=1_000):
    X, y = make_data(n + 10_000)
    (X, y), (X_test, y_test) = (X[:n], y[:n]), (X[n:], y[n:])
    inputs = {"X": X, "Z": inducing_inputs(X, m), "y": y, "batch_size": batch_size}
    print(autocvi.plan(svgp, inputs))
    start = time.perf_counter()
    result = autocvi.fit(svgp, inputs, num_steps=3_000, progress_bar=False)
    print(
        f"\n{result.num_steps} steps ({result.num_steps * batch_size / n:.0f} passes), "
        f"{time.perf_counter() - start:.1f} s including tracing and compilation; "
        f"converged: {result.converged}"
    )
    q = result.posterior["u"]
    nlpd = test_nlpd(q.mean, q.covariance_matrix, inputs["Z"], X_test, y_test)
    print(f"test NLPD: {float(nlpd):.4f}")


if __name__ == "__main__":
    main()
