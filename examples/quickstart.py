"""Quickstart: Bayesian logistic regression on scikit-learn's breast-cancer data.

Traces the model into the factor graph autocvi sees (with a conjugacy verdict
on every edge), prints it, fits it with CVI and prints a posterior summary.

    python examples/quickstart.py
"""

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from sklearn.datasets import load_breast_cancer

import autocvi


def logistic_regression(X, y=None):
    """y_n ~ Bernoulli(sigmoid(x_n^T w + b)), w ~ N(0, I), b ~ N(0, 1)."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w + b), obs=y)


def load_data(num_features: int = 10):
    data = load_breast_cancer()
    X = data.data[:, :num_features]
    X = (X - X.mean(0)) / X.std(0)
    return {"X": jnp.asarray(X, jnp.float32), "y": jnp.asarray(data.target, jnp.float32)}


def main():
    data = load_data()
    graph = autocvi.trace(logistic_regression, data)
    print(graph)
    print()
    for factor in graph.factors:
        for latent in graph.factors[factor].latents:
            print("  " + graph.explain(factor, latent))
    if hasattr(autocvi, "fit"):
        result = autocvi.fit(logistic_regression, data, rng_key=0)
        print()
        print(result.summary())


if __name__ == "__main__":
    main()
