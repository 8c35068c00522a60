"""GP classification: autocvi vs NumPyro SVI (AutoMultivariateNormal and
AutoLowRankMultivariateNormal, Adam at three learning rates).

Model, written as a user writes it (PG-SVI paper Sec. 7.1; KL-prox Sec. 6):

    f ~ MultivariateNormal(0, K)          K: squared-exponential kernel on the training inputs
    y_n ~ Bernoulli(logits = f_n)         in a plate

Data sets (training split only; the ELBO is the training ELBO), float64 throughout:

* ionosphere (../shared/data/ionosphere.npz, shipped training split, 280 x 34),
  (log l, log sigma) = (1, 2.5) as in the PG-SVI paper;
* digits 3-vs-5 (scikit-learn's bundled digits, pixels / 16, 50/50 split with
  seed 0, training half), (log l, log sigma) = (1.5, 2).

autocvi keeps f as a Gaussian block with one site per observation and a
function-space (Woodbury) solver; SVI parameterises f directly.

    python -m benchmarks gp_classification [--quick]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoMultivariateNormal

from . import common, svi_comparison

JITTER = 1e-5


def squared_exponential(X, log_lengthscale, log_sd):
    d2 = jnp.sum((X[:, None, :] - X[None, :, :]) ** 2, axis=-1)
    k = jnp.exp(2 * log_sd) * jnp.exp(-0.5 * d2 / jnp.exp(2 * log_lengthscale))
    return k + JITTER * jnp.exp(2 * log_sd) * jnp.eye(X.shape[0])


def model(K, y=None):
    """y_n ~ Bernoulli(sigmoid(f_n)), f ~ N(0, K)."""
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(K.shape[0]), K))
    with numpyro.plate("data", K.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def load_ionosphere():
    d = np.load(common.SHARED_DATA / "ionosphere.npz")
    X = jnp.asarray(d["X"], jnp.float64)
    y = jnp.asarray((np.ravel(d["y"]) > 0).astype(np.float64))
    return {"K": squared_exponential(X, 1.0, 2.5), "y": y}


def load_digits_3_vs_5():
    from sklearn.datasets import load_digits

    digits = load_digits()
    keep = np.isin(digits.target, (3, 5))
    X = digits.data[keep] / 16.0
    y = (digits.target[keep] == 5).astype(np.float64)
    order = np.random.default_rng(0).permutation(len(y))
    train = order[: len(y) // 2]
    return {
        "K": squared_exponential(jnp.asarray(X[train], jnp.float64), 1.5, 2.0),
        "y": jnp.asarray(y[train]),
    }


DATASETS = {
    "ionosphere": (load_ionosphere, "ionosphere.npz training split, (log l, log sigma) = (1, 2.5)"),
    "digits35": (
        load_digits_3_vs_5,
        "scikit-learn digits 3 vs 5, pixels/16, 50/50 split seed 0 (training half), "
        "(log l, log sigma) = (1.5, 2)",
    ),
}

SETTINGS = {
    "prior": "f ~ MultivariateNormal(0, K), squared-exponential K + 1e-5 sigma^2 I",
    "likelihood": "`Bernoulli(logits=f)` in a plate",
    "autocvi_num_steps": 30,
    "autocvi_mc_num_steps": 0,
    "autocvi_step_size": "engine default",
    "autocvi_num_samples": 16,
    "autocvi_rng_key": 0,
    "svi_guide": "AutoMultivariateNormal and AutoLowRankMultivariateNormal (defaults)",
    "svi_loss": "Trace_ELBO(num_particles=1)",
    "svi_learning_rates": [1e-3, 1e-2, 5e-2],
    "svi_num_steps": 10000,
    "svi_rng_key": 0,
    "svi_grid_points": 40,
    "estimator_num_samples": 4096,
    "estimator_rng_key": 12345,
    "thresholds_nats": [1.0, 0.1],
}


def run(quick: bool = False, names=None) -> dict:
    # float64 for every method: with sigma^2 = e^5 the kernel is ill-conditioned
    # and float32 MultivariateNormal log densities of SVI's guides break down.
    jax.config.update("jax_enable_x64", True)
    out = {}
    for name in names or DATASETS:
        loader, description = DATASETS[name]
        data = loader()
        n = int(data["y"].shape[0])
        settings = dict(SETTINGS, data=f"{description}, N = {n}")
        if quick:
            settings.update(svi_num_steps=2000, svi_grid_points=30)
        spec = {
            "name": f"gp_classification_{name}",
            "title": f"GP classification ({name}, N = D = {n})",
            "model": model,
            "data": data,
            "site": "f",
            "settings": settings,
            "guides": {"mvn": AutoMultivariateNormal, "lowrank": AutoLowRankMultivariateNormal},
        }
        out[name] = svi_comparison.run(spec, quick=quick)
    return out


def main(argv=None):
    argv = argv or []
    names = [a for a in argv if not a.startswith("-")] or None
    run(quick="--quick" in argv, names=names)


if __name__ == "__main__":
    main()
