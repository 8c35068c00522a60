"""GP regression with learned hyperparameters: autocvi's variational EM against NumPyro SVI.

The motorcycle data (133 points, standardised), a squared-exponential GP whose
length-scale, amplitude and noise are ``numpyro.param`` sites. The oracle is the exact
type-II maximum likelihood (scipy L-BFGS on the closed-form log marginal likelihood).
autocvi: one cold ``autocvi.fit`` (variational EM, M-steps on the dual bound). SVI: the
same model with AutoMultivariateNormal over f (and whitened: over u with f = cholesky(K) u),
params learned jointly by Adam, compiled ahead of time and run as one ``lax.scan`` per 100 steps; after every chunk the closed-form
log marginal likelihood at SVI's params is recorded. Both report the seconds to get within
0.1 nat of the optimum (SVI: compilation plus the chunks until then). Float64, one process.

    python -m benchmarks gp_regression_em [--quick]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoMultivariateNormal
from scipy.optimize import minimize

import autocvi

from . import driver as D
from . import sparse_gp_driver as G

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gp_hyperparameters import JITTER  # noqa: E402 - the example's model, as a user writes it
from gp_hyperparameters import gp_regression as model  # noqa: E402

NAMES = ("lengthscale", "amplitude", "noise")
SETTINGS = {
    "data": "mcycle.npz (133 points), times and accelerations standardised",
    "start": {"lengthscale": 1.0, "amplitude": 1.0, "noise": 0.5},
    "svi_learning_rates": [0.003, 0.01, 0.03],
    "svi_max_steps": 20000,
    "svi_chunk": 100,
    "target": "within 0.1 nat of the type-II maximum log marginal likelihood",
}


def kernel_params(X):
    """The hyperparameters as params and the kernel matrix they give."""
    lengthscale = numpyro.param("lengthscale", 1.0, constraint=constraints.positive)
    amplitude = numpyro.param("amplitude", 1.0, constraint=constraints.positive)
    noise = numpyro.param("noise", 0.5, constraint=constraints.positive)
    d = X[:, None] - X[None, :]
    K = amplitude**2 * jnp.exp(-0.5 * (d / lengthscale) ** 2) + JITTER * jnp.eye(X.shape[0])
    return K, noise


def model_whitened(X, y=None):
    """The same GP, whitened as SVI users write it: u ~ N(0, I), f = cholesky(K) u."""
    K, noise = kernel_params(X)
    u = numpyro.sample("u", dist.Normal(0.0, 1.0).expand([X.shape[0]]).to_event(1))
    numpyro.sample("y", dist.Normal(jnp.linalg.cholesky(K) @ u, noise), obs=y)


SVI_MODELS = {"unwhitened": model, "whitened": model_whitened}


def log_ml(params, x, y):
    """The closed-form log marginal likelihood at (lengthscale, amplitude, noise)."""
    ell, amp, noise = (float(params[n]) for n in NAMES)
    d = x[:, None] - x[None, :]
    K = amp**2 * np.exp(-0.5 * (d / ell) ** 2) + (JITTER + noise**2) * np.eye(len(x))
    L = np.linalg.cholesky(K)
    a = np.linalg.solve(L, y)
    return float(-0.5 * a @ a - np.log(np.diag(L)).sum() - 0.5 * len(x) * np.log(2 * np.pi))


def type2_ml(x, y):
    start = np.log([SETTINGS["start"][n] for n in NAMES])
    res = minimize(lambda u: -log_ml(dict(zip(NAMES, np.exp(u))), x, y), start, method="L-BFGS-B")
    return dict(zip(NAMES, np.exp(res.x).tolist())), -float(res.fun)


def run_svi(x, y, variant, lr, best, max_steps, chunk):
    m = SVI_MODELS[variant]
    svi = SVI(m, AutoMultivariateNormal(m), numpyro.optim.Adam(lr), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), x, y=y)

    compile_s, trace, state = G.svi_in_chunks(
        svi,
        state,
        chunk,
        max_steps,
        lambda state: (log_ml(svi.get_params(state), x, y),),
        x,
        y=y,
        stop=lambda row: row[2] >= best - 0.1,
    )
    hit = trace[-1] if trace and trace[-1][2] >= best - 0.1 else None
    reached = None if hit is None else {"steps": hit[0], "seconds": compile_s + hit[1]}
    params = {n: float(svi.get_params(state)[n]) for n in NAMES}
    return {
        "variant": variant,
        "lr": lr,
        "compile_s": compile_s,
        "reached": reached,
        "trace": trace,
        "params": params,
    }


def run(_part="mcycle", quick=False):
    jax.config.update("jax_enable_x64", True)
    data = autocvi.datasets.load("mcycle")["data"]
    x = (data[:, 0] - data[:, 0].mean()) / data[:, 0].std()
    y = (data[:, 1] - data[:, 1].mean()) / data[:, 1].std()
    reference, best = type2_ml(x, y)
    t = time.perf_counter()
    result = autocvi.fit(model, {"X": x, "y": y}, progress_bar=False)
    cvi_s = time.perf_counter() - t
    learned = {n: float(result.params[n]) for n in NAMES}
    autocvi_rec = {
        "seconds": cvi_s,
        "params": learned,
        "log_ml": log_ml(learned, x, y),
        "rounds": int(result.em.rounds),
        "iterations": int(result.num_steps),
        "converged": bool(result.converged),
    }
    st = dict(SETTINGS)
    if quick:
        st.update(svi_learning_rates=[0.01], svi_max_steps=2000)
    svi = [
        run_svi(x, y, variant, lr, best, st["svi_max_steps"], st["svi_chunk"])
        for variant in SVI_MODELS
        for lr in st["svi_learning_rates"]
    ]
    payload = {"benchmark": "gp_regression_em", "settings": st, "environment": D.environment()}
    payload.update(reference={"params": reference, "log_ml": best}, autocvi=autocvi_rec, svi=svi)
    md = markdown(payload)
    D.write("gp_regression_em", payload, md, lambda plt: plot(plt, payload))
    print(md)
    return payload


def markdown(p):
    ref, a = p["reference"], p["autocvi"]
    reached = [s for s in p["svi"] if s["reached"]]
    fastest = min(reached, key=lambda s: s["reached"]["seconds"]) if reached else None
    rows = [
        (
            "type-II maximum likelihood (scipy L-BFGS, closed form)",
            *(f"{ref['params'][n]:.5f}" for n in NAMES),
            f"{ref['log_ml']:.4f}",
            "",
            "",
        ),
        (
            "**autocvi.fit** (variational EM, cold)",
            *(f"{a['params'][n]:.5f}" for n in NAMES),
            f"{a['log_ml']:.4f}",
            f"{a['seconds']:.1f}",
            f"{a['rounds']} rounds, {a['iterations']} CVI iterations",
        ),
    ]
    for s in p["svi"]:
        r = s["reached"]
        when = f"{r['seconds']:.1f}" if r else f"not in {p['settings']['svi_max_steps']} steps"
        rows.append(
            (
                f"SVI {s['variant']}, Adam lr {s['lr']:g}",
                *(f"{s['params'][n]:.5f}" for n in NAMES),
                f"{s['trace'][-1][2]:.4f}",
                when,
                f"{s['trace'][-1][0]} steps in {s['trace'][-1][1]:.1f} s, compile {s['compile_s']:.1f} s",
            )
        )
    head = ("method", *NAMES, "log marginal likelihood", "seconds to 0.1 nat", "work")
    ratio = (
        f"autocvi / fastest SVI (seconds to within 0.1 nat, compilation included): "
        f"{a['seconds'] / fastest['reached']['seconds']:.2f}"
        if fastest
        else "SVI did not get within 0.1 nat at any learning rate"
    )
    return f"""# GP regression with learned hyperparameters: variational EM against SVI

{D.env_line(p["environment"], "gp_regression_em")}

Data: {p["settings"]["data"]}. A squared-exponential GP with length-scale, amplitude and noise as
`numpyro.param` sites (`benchmarks/gp_regression_em.py`); target: {p["settings"]["target"]}
({ref["log_ml"]:.4f}). autocvi: one cold `autocvi.fit`; SVI: AutoMultivariateNormal over f
(unwhitened) or over u with f = cholesky(K) u (whitened), the params learned jointly by Adam,
compiled once, run in chunks of {p["settings"]["svi_chunk"]} steps.

## Ratios: {ratio}

{D.md_table(head, rows)}
"""


def plot(plt, p):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    best = p["reference"]["log_ml"]
    for s in p["svi"]:
        t = np.asarray(s["trace"], float)
        ax.plot(
            s["compile_s"] + t[:, 1],
            np.maximum(best - t[:, 2], 1e-4),
            label=f"SVI {s['variant']} lr {s['lr']:g}",
        )
    a = p["autocvi"]
    ax.plot([a["seconds"]], [max(best - a["log_ml"], 1e-4)], "r*", ms=14, label="autocvi.fit (EM)")
    ax.axhline(0.1, color="grey", ls=":")
    ax.set(
        xlabel="seconds (compilation included)",
        ylabel="log ML gap to type-II optimum (nats)",
        yscale="log",
    )
    ax.legend()
    return fig


main = D.main_of(run, ["mcycle"])
