"""Bayesian logistic regression on breast_cancer_scale (CVI paper, Table 3 data).

    w ~ N(0, I)  (intercept is a column of ones in X)
    y_n ~ Bernoulli(sigmoid(x_n^T w))

The likelihood is not conjugate to the Gaussian prior; autocvi sees the
weights only through the logits ``X @ w`` and sends Gauss-Hermite messages
through them (CVI App. B.1), so every CVI step is a Bayesian linear
regression with pseudo-observations (CVI App. E.1). The data are bundled:
``autocvi.datasets.load("breast_cancer_scale")``.

    python examples/logistic_regression.py
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import autocvi


def logistic_regression(X, y=None):
    """y_n ~ Bernoulli(logits = x_n^T w), w ~ N(0, I) as one vector site."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def load_data():
    raw = autocvi.datasets.load("breast_cancer_scale")
    X = np.asarray(raw["X"], np.float32)
    y = (np.asarray(raw["y"]).ravel() - 2.0) / 2.0  # labels {2, 4} -> {0, 1}
    source = "breast_cancer_scale (LIBSVM breast-cancer, scaled to [-1, 1]; bundled)"
    X = np.concatenate([X, np.ones((X.shape[0], 1))], axis=1)  # intercept column
    data = {"X": jnp.asarray(X, jnp.float32), "y": jnp.asarray(y, jnp.float32)}
    return data, source


def main():
    data, source = load_data()
    print(f"data: {source}, X {tuple(data['X'].shape)}")
    graph = autocvi.trace(logistic_regression, data)
    print(graph)
    print()
    print(autocvi.plan(logistic_regression, data))
    print()
    result = autocvi.fit(logistic_regression, data, progress_bar=False)
    print(result.summary(max_elements=11))

    # Posterior predictive accuracy on the training data (a sanity check, not a test score).
    draws = result.sample(jax.random.PRNGKey(1), 1000)["w"]
    prob = jax.nn.sigmoid(data["X"] @ draws.T).mean(axis=1)
    acc = float(jnp.mean((prob > 0.5) == (data["y"] > 0.5)))
    print(f"\ntraining accuracy of the posterior predictive: {acc:.3f}")


if __name__ == "__main__":
    main()
