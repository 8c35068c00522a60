"""Gaussian-process classification on the ionosphere data (PG-SVI Sec. 7.1).

The latent function is one MultivariateNormal site over training *and* test
inputs; the Bernoulli likelihood touches only the training part. autocvi
whitens the kernel prior (no K^-1 is formed), sends Gauss-Hermite messages
through the logits (CVI App. B.1) and the posterior over the test inputs is
the GP predictive (KL-proximal paper Eq. 20), read from ``result.posterior``.

    python examples/gp_classification.py
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import autocvi

# Data sets with a shipped train/test split (X, y, X_te, y_te; labels in {-1, 1}) and
# the PG-SVI paper's kernel hyperparameters (log lengthscale, log signal sd) for each.
HYPERPARAMETERS = {"ionosphere": (1.0, 2.5), "sonar": (-1.0, 6.0)}


def squared_exponential(a, b, log_lengthscale, log_sd):
    d2 = jnp.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1)
    return jnp.exp(2 * log_sd) * jnp.exp(-0.5 * d2 / jnp.exp(2 * log_lengthscale))


def gp_classifier(X, X_test, y=None, log_lengthscale=1.0, log_sd=2.5):
    """f ~ GP(0, k) at train and test inputs; y_n ~ Bernoulli(sigmoid(f_n)) on train."""
    inputs = jnp.concatenate([X, X_test])
    kernel = squared_exponential(inputs, inputs, log_lengthscale, log_sd)
    kernel = kernel + 1e-5 * jnp.exp(2 * log_sd) * jnp.eye(inputs.shape[0])
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(inputs.shape[0]), kernel))
    with numpyro.plate("train", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=f[: X.shape[0]]), obs=y)


def predictive_probability(mean, var, num_nodes: int = 40):
    """p(y* = 1) = E_{N(f | mean, var)}[sigmoid(f)] by Gauss-Hermite quadrature."""
    x, w = np.polynomial.hermite_e.hermegauss(num_nodes)
    w = w / np.sqrt(2 * np.pi)
    f = mean[:, None] + np.sqrt(var)[:, None] * x[None, :]
    sigmoid = 0.5 * (1.0 + np.tanh(0.5 * f))  # no overflow for |f| in the hundreds
    return (w[None, :] * sigmoid).sum(axis=1)


def log_loss_bits(p, y):
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return float(-np.mean(y * np.log2(p) + (1 - y) * np.log2(1 - p)))


def load(name: str = "ionosphere"):
    """``(data, y_test)`` for a shipped split: ``"ionosphere"`` or ``"sonar"``.

    ``data`` holds the training inputs ``X``, labels ``y`` in {0, 1} and the test
    inputs ``X_test``; the model's hyperparameters are not included (see
    ``HYPERPARAMETERS``).
    """
    if name not in HYPERPARAMETERS:
        raise ValueError(f"unknown data set {name!r}; one of {sorted(HYPERPARAMETERS)}")
    d = autocvi.datasets.load(name)
    to01 = lambda v: (np.ravel(v) > 0).astype(np.float32)  # noqa: E731 - labels in {-1, 1}
    return (
        {
            "X": jnp.asarray(d["X"], jnp.float32),
            "X_test": jnp.asarray(d["X_te"], jnp.float32),
            "y": jnp.asarray(to01(d["y"])),
        },
        to01(d["y_te"]),
    )


def load_data():
    """The training inputs and labels and the test inputs (ionosphere split)."""
    return load()[0]


def main():
    data, y_test = load()
    print(autocvi.plan(gp_classifier, data))
    result = autocvi.fit(gp_classifier, data, rng_key=0)
    n = data["X"].shape[0]
    q = result.posterior["f"]
    mean = np.asarray(q.loc)[n:]
    var = np.diag(np.asarray(q.covariance_matrix))[n:]
    p = predictive_probability(mean, var)
    print(f"\n{result.num_steps} iterations, ELBO {result.elbo[-1]:.3f}")
    print(
        f"test log-loss {log_loss_bits(p, y_test):.3f} bits, accuracy {np.mean((p > 0.5) == y_test):.3f}"
    )


if __name__ == "__main__":
    main()
