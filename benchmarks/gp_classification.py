"""GP classification, ``f ~ MultivariateNormal(0, K)``, ``y ~ Bernoulli(logits=f)`` in float64:
autocvi (also minibatched, B = N/5) vs NumPyro SVI (:mod:`benchmarks.svi_comparison`), with a
test log-loss in bits through the GP conditional.

    python -m benchmarks gp_classification[:ionosphere|:sonar] [--quick]
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoMultivariateNormal

from autocvi import datasets

from . import driver as D
from . import svi_comparison

JITTER = 1e-5
# Gauss-Hermite rule for E[sigmoid(f*)] (numpy's probabilists' nodes; weights sum to 1).
GH_NODES, GH_WEIGHTS = (jnp.asarray(a) for a in np.polynomial.hermite_e.hermegauss(32))
GH_WEIGHTS = GH_WEIGHTS / jnp.sum(GH_WEIGHTS)


def squared_exponential(Xa, Xb, log_l, log_sd):
    d2 = jnp.sum((Xa[:, None, :] - Xb[None, :, :]) ** 2, axis=-1)
    return jnp.exp(2 * log_sd) * jnp.exp(-0.5 * d2 / jnp.exp(2 * log_l))


def model(K, y=None, batch_size=None):
    """y_n ~ Bernoulli(sigmoid(f_n)), f ~ N(0, K); ``batch_size``: the plate subsampled (without
    it autocvi plans the same function-space block as for ``y ~ Bernoulli(logits=f)``)."""
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(K.shape[0]), K))
    with numpyro.plate("data", K.shape[0], subsample_size=batch_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=f[idx]), obs=y[idx])


def log_loss_bits(mean, var, y):
    """Mean of -log2 p(y*), p(y* = 1) = E[sigmoid(f*)], f* ~ N(mean, var) (32-node GH)."""
    f = mean[:, None] + jnp.sqrt(jnp.maximum(var, 0.0))[:, None] * GH_NODES[None, :]
    lp1 = jax.scipy.special.logsumexp(jax.nn.log_sigmoid(f), b=GH_WEIGHTS[None], axis=1)
    lp0 = jax.scipy.special.logsumexp(jax.nn.log_sigmoid(-f), b=GH_WEIGHTS[None], axis=1)
    return -jnp.mean(jnp.where(y > 0, lp1, lp0)) / jnp.log(2.0)


def problem(Xtr, ytr, Xte, yte, log_l, log_sd):
    """Training data and the test metric of a posterior over f (KL-prox Eq. 20):
    ``f* | f`` is the GP conditional, ``f* = A f + e`` with ``A = K*f K^-1``."""
    K = squared_exponential(Xtr, Xtr, log_l, log_sd)
    K = K + JITTER * jnp.exp(2 * log_sd) * jnp.eye(len(ytr))
    Kst = squared_exponential(Xte, Xtr, log_l, log_sd)
    A = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(K), True), Kst.T).T
    base = jnp.exp(2 * log_sd) - jnp.sum(A * Kst, axis=1)
    metric = jax.jit(lambda m, S: log_loss_bits(A @ m, base + jnp.sum((A @ S) * A, axis=1), yte))
    return {"K": K, "y": ytr}, lambda q: metric(q["f"].mean, q["f"].covariance_matrix)


POINT = {"ionosphere": (1.0, 2.5), "sonar": (-1.0, 6.0)}  # the papers' (log l, log sigma)
DATASETS = {
    "ionosphere": "ionosphere.npz shipped split (280 train, 71 test), (log l, log sigma) = (1, 2.5) as in the PG-SVI paper",
    "sonar": "sonar.npz shipped split (165 train, 43 test), (log l, log sigma) = (-1, 6) as in the PG-SVI paper "
    "(a very ill-conditioned kernel: sigma^2 = e^12)",
}
PER_DATASET = {"ionosphere": (30, ("mvn", "lowrank")), "sonar": (300, ("mvn",))}  # steps, guides
GUIDES = {"mvn": AutoMultivariateNormal, "lowrank": AutoLowRankMultivariateNormal}
SETTINGS = {
    **svi_comparison.DEFAULTS,
    "prior": "f ~ MultivariateNormal(0, K), squared-exponential K + 1e-5 sigma^2 I",
    "likelihood": "`Bernoulli(logits=f)` in a plate",
    "autocvi_num_samples": 16,
    "autocvi_repeats": 1,
    "autocvi_score_every_until": 30,
    "autocvi_score_points": 25,
    "svi_num_steps": 3000,
    "svi_repeats": 1,
    "svi_grid_points": 25,
    "estimator_num_samples": 4096,
    "minibatch": "B = N/5, 5 passes",
    "test_metric_definition": "mean over test points of -log2 E_q[sigmoid(f*)], f* | f from the GP conditional, Gauss-Hermite",
}
QUICK = {"autocvi_num_steps": 20, "svi_num_steps": 1000, "svi_grid_points": 20}


def run(name, quick=False):
    jax.config.update("jax_enable_x64", True)
    d = datasets.load(name)
    X, Xte = (jnp.asarray(d[k], jnp.float64) for k in ("X", "X_te"))
    y, yte = (jnp.asarray((np.ravel(d[k]) > 0).astype(np.float64)) for k in ("y", "y_te"))
    data, metric = problem(X, y, Xte, yte, *POINT[name])
    n = int(data["y"].shape[0])
    steps, guides = PER_DATASET[name]
    st = {**SETTINGS, "data": f"{DATASETS[name]}, N = {n}", "autocvi_num_steps": steps}
    st.update(QUICK if quick else {})

    entry, k = svi_comparison.autocvi_entry, st["autocvi_num_samples"]
    b = max(1, round(0.2 * n))  # B = N/5, 5 passes
    mb, steps = dict(data, batch_size=b), int(np.ceil(5 * n / b))
    entries = [
        entry(st, "autocvi", model, data, st["autocvi_num_steps"], num_samples=k),
        entry(st, f"autocvi-minibatch-{b}", model, mb, steps, b / n, num_samples=k),
    ]
    spec = {
        "cmd": f"gp_classification:{name}",
        "title": f"GP classification ({name}, N = D = {n})",
        "site": "f",
        "guides": {g: GUIDES[g] for g in guides},
        "test_metric": ("test log-loss (bits)", metric),
        "autocvi": entries,
    }
    return svi_comparison.run(spec, st)


main = D.main_of(run, ["ionosphere", "sonar"])
