"""Quickstart: Bayesian logistic regression on scikit-learn's breast-cancer data.

Prints the factor graph autocvi sees for every example model in examples/ (with
the conjugacy verdict of every edge and the family of every latent), then traces,
explains, plans and fits logistic regression with CVI and prints a posterior
summary.

    python examples/quickstart.py
"""

import importlib
import sys
from pathlib import Path

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from sklearn.datasets import load_breast_cancer

import autocvi

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (module in examples/, model function): each module has load_data().
EXAMPLES = [
    ("gaussian_mixture", "gmm"),
    ("poisson_gamma_factorization", "poisson_gamma"),
    ("gamma_factor_model", "gamma_factor_model"),
    ("gp_classification", "gp_classifier"),
    ("poisson_random_walk", "random_walk_poisson"),
]


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


def print_example_graphs():
    """The classification autocvi makes of every example model."""
    for module_name, model_name in EXAMPLES:
        module = importlib.import_module(module_name)
        data = module.load_data()  # bundled data (autocvi.datasets) or scikit-learn's
        graph = autocvi.trace(getattr(module, model_name), data)
        print(f"[examples/{module_name}.py] {model_name}")
        print(graph)
        print()


def main():
    print("=" * 30, "How autocvi reads the example models", "=" * 30, "\n")
    print_example_graphs()

    print("=" * 30, "Quickstart: logistic regression", "=" * 30, "\n")
    data = load_data()
    graph = autocvi.trace(logistic_regression, data)
    print(graph)
    print()
    for factor in graph.factors:
        for latent in graph.factors[factor].latents:
            print("  " + graph.explain(factor, latent))
    print()
    print(autocvi.plan(logistic_regression, data))
    result = autocvi.fit(logistic_regression, data, rng_key=0, progress_bar=False)
    print()
    print(result.summary())


if __name__ == "__main__":
    main()
