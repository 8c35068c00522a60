"""Bayesian logistic regression on breast_cancer_scale: autocvi vs NumPyro SVI.

Model (CVI paper Table 3 data, prior variance 1, intercept column added):

    w ~ N(0, I_11)                       one vector site (.expand([D]).to_event(1))
    y_n ~ Bernoulli(logits = x_n^T w)    n = 1..683, in a plate

Methods, all in this process on the same data:

* autocvi, default schedule (Gauss-Hermite messages for the likelihood when
  the engine provides them), run for a fixed number of iterations with every
  iteration timed; plus the same run with Monte Carlo messages
  (``use_quadrature=False``) when the engine has that switch; plus one call of
  ``autocvi.fit`` with its defaults (convergence stop), as a user would run it.
* NumPyro SVI, ``AutoMultivariateNormal`` guide, ``Trace_ELBO`` (one particle),
  Adam at three learning rates, 20,000 steps as one ``lax.scan``.

Every posterior (each autocvi iteration; SVI on a log-spaced grid of steps,
refined step by step around each threshold crossing) is evaluated by the same
estimator: 65,536 draws of q with one shared key, numpyro ``log_density`` of
the model minus ``log q``. The reference optimum ``ELBO*`` is the best final
ELBO of any method under that estimator.

    python -m benchmarks logistic_regression [--quick]
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoMultivariateNormal

from . import common, svi_comparison

NAME = "logistic_regression"

SETTINGS = {
    "data": "breast_cancer_scale.npz (683 x 10, y in {2,4} -> (y-2)/2), intercept column added",
    "prior": "w ~ N(0, I), D = 11",
    "autocvi_num_steps": 100,
    "autocvi_mc_num_steps": 200,
    "autocvi_step_size": "engine default",
    "autocvi_num_samples": 16,
    "autocvi_rng_key": 0,
    "svi_guide": "AutoMultivariateNormal (default init_loc_fn, init_scale=0.1)",
    "svi_loss": "Trace_ELBO(num_particles=1)",
    "svi_learning_rates": [1e-3, 1e-2, 5e-2],
    "svi_num_steps": 20000,
    "svi_rng_key": 0,
    "svi_grid_points": 150,
    "estimator_num_samples": 65536,
    "likelihood": "`Bernoulli(logits=X @ w)` in a plate",
    "estimator_rng_key": 12345,
    "thresholds_nats": [1.0, 0.1],
}


def model(X, y=None):
    """y_n ~ Bernoulli(sigmoid(x_n^T w)), w ~ N(0, I) (intercept is a column of X)."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def load_data():
    raw = np.load(common.SHARED_DATA / "breast_cancer_scale.npz")
    X = np.asarray(raw["X"], np.float32)
    y = ((np.asarray(raw["y"]).ravel() - 2.0) / 2.0).astype(np.float32)
    X = np.concatenate([X, np.ones((X.shape[0], 1), np.float32)], axis=1)
    return {"X": jnp.asarray(X), "y": jnp.asarray(y)}


def run(quick: bool = False) -> dict:
    spec = {
        "name": NAME,
        "title": "Logistic regression (breast_cancer_scale, N=683, D=11)",
        "model": model,
        "data": load_data(),
        "site": "w",
        "settings": SETTINGS,
        "guides": {"mvn": AutoMultivariateNormal},
    }
    return svi_comparison.run(spec, quick=quick)


def main(argv=None):
    quick = argv is not None and "--quick" in argv
    run(quick=quick)


if __name__ == "__main__":
    main()
