"""Direct loss minimisation for sparse GP classification and counts (DLM paper, Sec. 6; issue 16).

Probit classification (ionosphere and breast_cancer_scale, bundled with autocvi) and Poisson
count regression (doctor visits ``mdvis`` of statsmodels' RAND health insurance data, 1,000
rows drawn with seed 0; offline stand-ins for the paper's UCI sets). As in ``benchmarks.dlm``:
67/8/25 splits (seed 0), inputs standardised by the training rows, an SVGP with m = 50
inducing inputs whose kernel and inducing inputs are learned once by autocvi's EM on the ELBO
and then held; the ELBO, the beta-ELBO and log-loss DLM with beta chosen on the validation
split (every other value of ``autocvi.beta_grid(n)``). At DLM's beta, the paper's sampling
estimators replace the quadrature's gradients: bMC and uPS with 10 draws per element and step.
At that beta, natural-gradient DLM against the paper's Adam training, run by autocvi itself
(``fit(..., optimizer=optax.adam(0.01))``, 20,000 steps): iterations to Adam's final test NLL.

Test scores: NLL (``-log E_q[p(y | f)]`` per point, 60-node Gauss-Hermite), the error (the
misclassification rate; for counts the mean absolute error of the predictive mean), and
calibration (classification: expected calibration error over 10 bins of the predicted
probability; counts: coverage of the central 90% predictive interval). Float64, one process.

    python -m benchmarks dlm_nonconjugate [--quick]
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from scipy import special, stats

import autocvi

from . import dlm
from . import driver as D
from . import svgp_uci as S

LIKELIHOODS = {
    # logits = log Phi(f) - log Phi(-f): Bernoulli(Phi(f)) without log(0) in the tails
    "probit": lambda f: dist.Bernoulli(
        logits=jax.scipy.stats.norm.logcdf(f) - jax.scipy.stats.norm.logcdf(-f)
    ),
    "poisson": lambda f: dist.Poisson(jnp.exp(f)),
}
DATASETS = {"ionosphere": "probit", "breast_cancer_scale": "probit", "randhie": "poisson"}
SETTINGS = {
    "split": "67/8/25 train/validation/test, seed 0; inputs standardised by train",
    "model": "SVGP, m = 50 inducing inputs, ARD kernel; probit or Poisson (log link)",
    "hyperparameters": "learned by autocvi's EM on the ELBO, then held for every objective",
    "beta_grid": "every other value of autocvi.beta_grid(n)",
    "estimators": "at DLM's chosen beta: DLM(gradient='bmc' | 'ups', num_samples=10)",
    "max_iterations": 2000,
    "adam": {"learning_rate": 0.01, "steps": 20000, "score_every": 200},
    "adam_training": "autocvi.fit(..., optimizer=optax.adam(0.01)) at DLM's beta: q(u)'s mean "
    "and Cholesky factor (whitened), the paper's training",
    "target": "within 0.001 nats of Adam's final test NLL",
    "first_hit": "each training's first scored point at the target, refined to single steps",
}


def sgp(X, Z0, y=None, likelihood="probit"):
    """The SVGP as a user writes it, with the likelihood named."""
    p = S.hyperparameters(Z0, False)
    Kuu, A, residual = S.conditional(p, X)
    u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(Z0.shape[0]), Kuu))
    with numpyro.plate("data", X.shape[0]):
        f = numpyro.sample("f", dist.Normal(A @ u, jnp.sqrt(residual)))
        numpyro.sample("y", LIKELIHOODS[likelihood](f), obs=y)


def load(name):
    if name == "randhie":
        import statsmodels.api as sm

        df = sm.datasets.randhie.load_pandas().data
        rows = np.random.RandomState(0).permutation(len(df))[:1000]
        return df.iloc[rows, 1:].to_numpy(float), df["mdvis"].to_numpy(float)[rows]
    raw = autocvi.datasets.load(name)
    X = np.concatenate([raw["X"], raw["X_te"]]) if "X_te" in raw else np.asarray(raw["X"])
    y = np.concatenate([raw["y"], raw["y_te"]]) if "y_te" in raw else np.asarray(raw["y"])
    y = np.asarray(y, float).ravel()
    return np.asarray(X, float), (y == y.max()).astype(float)


def scores(p, mean, cov, X, y, likelihood):
    """(test NLL, error, calibration) of q(u) = N(mean, cov) (module docstring)."""
    mu, var = S.marginals(p, mean, cov, X)
    x, w = np.polynomial.hermite_e.hermegauss(60)
    f = mu[:, None] + np.sqrt(var)[:, None] * x[None]
    log_w = np.log(w / np.sqrt(2 * np.pi))
    if likelihood == "probit":
        p1 = np.exp(special.logsumexp(log_w + stats.norm.logcdf(f), axis=1))
        nll = -np.mean(np.log(np.where(y > 0, p1, 1.0 - p1)))
        error = np.mean((p1 > 0.5) != (y > 0))
        bins = np.minimum((p1 * 10).astype(int), 9)
        ece = sum(
            np.sum(bins == b) / len(y) * abs(np.mean(p1[bins == b]) - np.mean(y[bins == b]))
            for b in range(10)
            if np.any(bins == b)
        )
        return float(nll), float(error), float(ece)
    ks = np.arange(int(y.max()) + 200)
    pmf = np.exp(
        special.logsumexp(log_w[None, None] + stats.poisson.logpmf(ks[:, None, None], np.exp(f)), 2)
    )  # (k, n)
    nll = -np.mean(np.log(pmf[y.astype(int), np.arange(len(y))]))
    cdf = np.cumsum(pmf, 0)
    lo, hi = np.argmax(cdf >= 0.05, 0), np.argmax(cdf >= 0.95, 0)
    mae = np.mean(np.abs(np.exp(mu + var / 2) - y))
    return float(nll), float(mae), float(np.mean((lo <= y) & (y <= hi)))


def run_dataset(name, quick):
    likelihood = DATASETS[name]
    X, y = load(name)
    (Xtr, ytr), (Xva, yva), (Xte, yte) = dlm.splits(X, y, scale_targets=False)
    model = functools.partial(sgp, likelihood=likelihood)
    m = min(S.M, len(ytr) // 2)
    Z0 = Xtr[np.random.RandomState(0).permutation(len(ytr))[:m]]
    data = {"X": Xtr, "Z0": Z0, "y": ytr}
    t = time.perf_counter()
    learned = autocvi.fit(model, data, progress_bar=False)
    p = {k: np.asarray(v) for k, v in learned.params.items()}
    em_seconds = time.perf_counter() - t
    fixed = handlers.substitute(model, data=dict(p))
    grid = autocvi.beta_grid(len(ytr))[::2]
    if quick:
        grid = grid[::3]

    def fit(objective):
        t = time.perf_counter()
        kwargs = {} if objective is None else {"objective": objective}
        result = autocvi.fit(
            fixed, data, progress_bar=False, learn_params=False, num_steps=2000, **kwargs
        )
        mean, cov = dlm.q_of(result)
        test = scores(p, mean, cov, Xte, yte, likelihood)
        return {
            "valid_nll": scores(p, mean, cov, Xva, yva, likelihood)[0],
            "test_nll": test[0],
            "test_error": test[1],
            "calibration": test[2],
            "iterations": int(result.num_steps),
            "converged": bool(result.converged),
            "seconds": time.perf_counter() - t,
        }

    rows = {"ELBO": dict(fit(None), beta=None)}
    for label, make in (("beta-ELBO", autocvi.BetaELBO), ("DLM, log loss", autocvi.DLM)):
        fits = [dict(fit(make(float(b))), beta=float(b)) for b in grid]
        rows[label] = min(fits, key=lambda r: r["valid_nll"])
    beta = rows["DLM, log loss"]["beta"]
    for gradient in ("bmc", "ups"):
        objective = autocvi.DLM(beta=beta, gradient=gradient, num_samples=10)
        rows[f"DLM, log loss, {gradient} (L = 10)"] = dict(fit(objective), beta=beta)
    # natural-gradient steps against Adam (autocvi's optimizer=) on the same objective
    st = SETTINGS["adam"]
    objective = autocvi.DLM(beta=beta)

    def score(result):
        return scores(p, *dlm.q_of(result), Xte, yte, likelihood)[0]

    adam, adam_hit = dlm.autocvi_adam_trace(
        fixed,
        data,
        objective,
        score,
        st["learning_rate"],
        2000 if quick else st["steps"],
        st["score_every"],
    )
    target = adam[-1][1] + 1e-3
    natural, ng_steps = dlm.natural_gradient_trace(fixed, data, objective, score, 2000)
    ng_hit, adam_hit = dlm.first_hit(natural, target, ng_steps), adam_hit(target)
    print(f"[{name}] {rows}\n  NG to target {ng_hit}, Adam {adam_hit}")
    return {
        "data": name,
        "likelihood": likelihood,
        "n_train": len(ytr),
        "n_test": len(yte),
        "inputs": X.shape[1],
        "em_seconds": em_seconds,
        "objectives": rows,
        **dlm.adam_record(natural, adam, ng_hit, adam_hit),
    }


def run(quick=False):
    jax.config.update("jax_enable_x64", True)
    records = [run_dataset(name, quick) for name in DATASETS]
    return D.publish(
        "dlm_nonconjugate", dict(SETTINGS, quick=quick), markdown, plot, datasets=records
    )


def plot(plt, p):
    return dlm.plot(plt, p, "test NLL", "Adam DLM (autocvi optimizer=)")


def markdown(p):
    lines = [
        "# Direct loss minimisation for sparse GP classification and counts (DLM paper, Sec. 6)",
        "",
        D.env_line(p["environment"], "dlm_nonconjugate"),
        "",
        "Settings: " + "; ".join(f"{k}: {v}" for k, v in p["settings"].items()),
        "",
        "## Results: test scores",
        "",
        "Error: misclassification rate (probit) or mean absolute error of the predictive "
        "mean (Poisson). Calibration: expected calibration error, 10 bins (probit; lower "
        "is better) or coverage of the central 90% predictive interval (Poisson; 0.9 is "
        "ideal).",
        "",
        *dlm.objective_rows(
            p,
            lambda r: f"{r['data']} ({r['likelihood']}, n = {r['n_train']})",
            {"test NLL": "{test_nll:.4f}", "error": "{test_error:.4f}"}
            | {"calibration": "{calibration:.3f}"},
        ),
        "",
        *dlm.adam_table(p, "test NLL"),
    ]
    return "\n".join(lines)


def main(argv=None):
    run(quick="--quick" in (argv or []))


if __name__ == "__main__":
    main()
