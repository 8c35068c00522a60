"""Sparse GP classification on the banana toy: hyperparameters by EM against SVI (t-SVGP Fig. 1-2).

The banana set (400 points, standardised), m = 10 inducing inputs (a fixed random subset of
the inputs), a squared-exponential kernel whose amplitude and length-scale are
``numpyro.param`` sites starting at (1, 1) as in the paper, written with the exact SVGP
conditional ``f_i ~ Normal(k_i^T Kuu^-1 u, sqrt(k_ii - q_ii))``, which autocvi integrates
into the likelihood's expectation (q(u) p(f | u), as SVGP). autocvi: one cold
``autocvi.fit`` per M-step bound (t-SVGP Eq. 15 "dual": the prior moves, the likelihood's
messages are held; Eq. 14 "standard": q held), with the params after every EM round.
SVI: the same SVGP ELBO (the likelihood's expectation over the residual by 32-node
Gauss-Hermite as a ``numpyro.factor``, q(u) by AutoMultivariateNormal, unwhitened or
whitened u = chol(Kuu) v), params learned jointly by Adam at three rates, compiled once and
run in chunks. Every method is scored by the same exact SVGP ELBO (60-node Gauss-Hermite over
each f_i's marginal, closed-form KL) at its params and q(u); the target is 0.1 nat of the best
ELBO any method reached. Float64; every method's first run in a fresh process of its own
(seconds include its setup, tracing and compilation), autocvi's warm refit after it.

    python -m benchmarks svgp_banana [--quick]
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

import autocvi

from . import driver as D
from . import sparse_gp_driver as G

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from sparse_gp_classification import (  # noqa: E402 - the example's model
    JITTER,
    banana,
    kernel,
    svgp,  # noqa: E402
)

NAMES = ("amplitude", "lengthscale")
SETTINGS = {
    "data": "banana.npz (400 x 2, standardised), labels in {0, 1}",
    "inducing": "m = 10 inputs chosen at random (seed 0), fixed",
    "start": {"amplitude": 1.0, "lengthscale": 1.0},
    "svi_learning_rates": [0.003, 0.01, 0.03],
    "svi_max_steps": 20000,
    "svi_chunk": 200,
    "target": "within 0.1 nat of the best SVGP ELBO any method reached",
}
_X, _W = np.polynomial.hermite_e.hermegauss(32)
_W = _W / np.sqrt(2 * np.pi)


def hyperparameters():
    amplitude = numpyro.param("amplitude", 1.0, constraint=constraints.positive)
    lengthscale = numpyro.param("lengthscale", 1.0, constraint=constraints.positive)
    return amplitude, lengthscale


def conditional(amplitude, lengthscale, X, Z):
    """A = Kfu Kuu^-1 and the residual variances k_ii - q_ii."""
    Kuu = kernel(amplitude, lengthscale, Z, Z) + JITTER * jnp.eye(Z.shape[0])
    Kfu = kernel(amplitude, lengthscale, X, Z)
    A = jnp.linalg.solve(Kuu, Kfu.T).T
    return Kuu, A, jnp.clip(amplitude**2 - jnp.sum(A * Kfu, -1), 1e-10)


def svi_model(X, Z, y, whitened=False):
    """The SVGP ELBO for SVI: q(u) from the guide, f's residual by quadrature."""
    amplitude, lengthscale = hyperparameters()
    Kuu, A, residual = conditional(amplitude, lengthscale, X, Z)
    m = Z.shape[0]
    if whitened:
        v = numpyro.sample("v", dist.Normal(0.0, 1.0).expand([m]).to_event(1))
        u = jnp.linalg.cholesky(Kuu) @ v
    else:
        u = numpyro.sample("u", dist.MultivariateNormal(jnp.zeros(m), Kuu))
    f = (A @ u)[:, None] + jnp.sqrt(residual)[:, None] * _X[None]
    sign = (2.0 * y - 1.0)[:, None]
    numpyro.factor("y", jnp.sum(_W * jax.nn.log_sigmoid(sign * f)))


def svgp_elbo(params, mean, cov, X, Z, y):
    """The exact SVGP ELBO at (params, q(u) = N(mean, cov)) (60-node Gauss-Hermite)."""
    amp, ell = (float(params[n]) for n in NAMES)
    Kuu, A, residual = (np.asarray(a) for a in conditional(amp, ell, X, Z))
    mu = A @ mean
    var = np.sum((A @ cov) * A, -1) + residual
    x, w = np.polynomial.hermite_e.hermegauss(60)
    w = w / np.sqrt(2 * np.pi)
    f = mu[:, None] + np.sqrt(var)[:, None] * x[None]
    ell_term = np.sum(w * -np.logaddexp(0.0, -(2 * y - 1)[:, None] * f))
    L = np.linalg.cholesky(Kuu)
    Kinv_cov = np.linalg.solve(Kuu, cov)
    alpha = np.linalg.solve(L, mean)
    kl = 0.5 * (
        np.trace(Kinv_cov)
        + alpha @ alpha
        - len(mean)
        + 2 * np.log(np.diag(L)).sum()
        - np.linalg.slogdet(cov)[1]
    )
    return float(ell_term - kl)


def run_autocvi(X, Z, y, bound):
    t = time.perf_counter()
    result = autocvi.fit(
        svgp, {"X": X, "Z": Z, "y": y}, em=autocvi.EMOptions(bound=bound), progress_bar=False
    )
    seconds = time.perf_counter() - t
    q = result.posterior["u"]
    params = {n: float(result.params[n]) for n in NAMES}
    return {
        "bound": bound,
        "seconds": seconds,
        "params": params,
        "elbo": svgp_elbo(params, np.asarray(q.mean), np.asarray(q.covariance_matrix), X, Z, y),
        "rounds": int(result.em.rounds),
        "iterations": int(result.num_steps),
        "converged": bool(result.converged),
        "trajectory": [{n: float(p[n]) for n in NAMES} for p in result.em.params],
        "integrated": [it.describe() for it in result.schedule.integrated],
    }


def svi_q(variant, svi, state, X, Z):
    """q(u)'s mean and covariance from the guide's params (mapped through chol(Kuu))."""
    params = svi.get_params(state)
    loc = np.asarray(params["auto_loc"])
    L = np.asarray(params["auto_scale_tril"])
    cov = L @ L.T
    if variant == "whitened":
        Kuu = conditional(params["amplitude"], params["lengthscale"], X, Z)[0]
        Lk = np.asarray(jnp.linalg.cholesky(Kuu))
        return Lk @ loc, Lk @ cov @ Lk.T, params
    return loc, cov, params


def run_svi(X, Z, y, variant, lr, max_steps, chunk):
    whitened = variant == "whitened"

    def model(X, Z, y):
        return svi_model(X, Z, y, whitened)

    start = time.perf_counter()  # the guide and svi.init: tracing, init search, compilations
    svi = SVI(model, AutoMultivariateNormal(model), numpyro.optim.Adam(lr), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), X, Z, y)
    setup_s = time.perf_counter() - start

    def score(state):
        mean, cov, params = svi_q(variant, svi, state, X, Z)
        p = {n: float(params[n]) for n in NAMES}
        return svgp_elbo(p, mean, cov, X, Z, y), p

    compile_s, trace, _ = G.svi_in_chunks(svi, state, chunk, max_steps, score, X, Z, y)
    return {
        "variant": variant,
        "lr": lr,
        "setup_s": setup_s,
        "compile_s": compile_s,
        "trace": trace,
    }


def cold_autocvi(bound):
    """:func:`run_autocvi` as the first fit of a fresh process (``D.in_fresh_process``),
    then a second fit of the same model and shapes (what a user waits for on refits)."""
    jax.config.update("jax_enable_x64", True)
    X, Z, y = banana()
    first = run_autocvi(X, Z, y, bound)
    first["warm_seconds"] = run_autocvi(X, Z, y, bound)["seconds"]
    return first


def cold_svi(variant, lr, max_steps, chunk):
    """:func:`run_svi` as the first run of a fresh process (``D.in_fresh_process``)."""
    jax.config.update("jax_enable_x64", True)
    return run_svi(*banana(), variant, lr, max_steps, chunk)


def run(_part="banana", quick=False):
    st = dict(SETTINGS)
    if quick:
        st.update(svi_learning_rates=[0.01], svi_max_steps=2000)
    # Every method's first run in a fresh process: in one process the runs after the first
    # find JAX's caches warm (the standard bound's cold fit read 3.0 s there, 10 s alone).
    cvi = [D.in_fresh_process(__name__, "cold_autocvi", b) for b in ("dual", "standard")]
    svi = [
        D.in_fresh_process(__name__, "cold_svi", v, lr, st["svi_max_steps"], st["svi_chunk"])
        for v in ("unwhitened", "whitened")
        for lr in st["svi_learning_rates"]
    ]
    best = max([c["elbo"] for c in cvi] + [max(t[2] for t in s["trace"]) for s in svi])
    for s in svi:
        for gap, key in ((0.1, "reached"), (0.01, "reached_001")):
            hit = next((t for t in s["trace"] if t[2] >= best - gap), None)
            waited = s["setup_s"] + s["compile_s"] + hit[1] if hit is not None else None
            s[key] = None if hit is None else {"steps": hit[0], "seconds": waited}
    for c in cvi:
        c["reached"] = c["elbo"] >= best - 0.1
        c["reached_001"] = c["elbo"] >= best - 0.01
    return D.publish("svgp_banana", st, markdown, plot, best_elbo=best, autocvi=cvi, svi=svi)


def markdown(p):
    best = p["best_elbo"]
    rows = []
    for c in p["autocvi"]:
        rows.append(
            (
                f"**autocvi.fit**, EM on the {c['bound']} bound (cold)",
                *(f"{c['params'][n]:.4f}" for n in NAMES),
                f"{c['elbo']:.4f}",
                f"{c['seconds']:.1f}" if c["reached"] else "not reached",
                f"{c['seconds']:.1f}" if c["reached_001"] else "not reached",
                f"{c['rounds']} rounds, {c['iterations']} CVI iterations; "
                f"warm refit {c['warm_seconds']:.1f} s",
            )
        )
    for s in p["svi"]:
        last = s["trace"][-1]
        r, r2 = s["reached"], s["reached_001"]
        never = f"not in {p['settings']['svi_max_steps']} steps"
        rows.append(
            (
                f"SVI {s['variant']}, Adam lr {s['lr']:g}",
                *(f"{last[3][n]:.4f}" for n in NAMES),
                f"{last[2]:.4f}",
                f"{r['seconds']:.1f}" if r else never,
                f"{r2['seconds']:.1f}" if r2 else never,
                f"{last[0]} steps in {last[1]:.1f} s; setup {s['setup_s']:.1f} s, "
                f"compile {s['compile_s']:.1f} s",
            )
        )
    head = ("method", *NAMES, "SVGP ELBO", "seconds to 0.1 nat", "seconds to 0.01 nat", "work")
    dual = p["autocvi"][0]
    reached = [s for s in p["svi"] if s["reached"]]
    if reached and dual["reached"]:
        fastest = min(reached, key=lambda s: s["reached"]["seconds"])
        ratio = (
            f"fastest SVI / autocvi (dual) seconds to within 0.1 nat of the best ELBO, "
            f"each the first run of a fresh process (setup and compilation included): "
            f"{fastest['reached']['seconds'] / dual['seconds']:.2f}"
        )
    elif dual["reached"]:
        ratio = "no SVI setting got within 0.1 nat of the best ELBO"
    reached_001 = [s for s in p["svi"] if s["reached_001"]]
    if dual["reached_001"] and not reached_001:
        ratio += (
            f"; within 0.01 nat: autocvi {dual['seconds']:.1f} s, no SVI setting in "
            f"{p['settings']['svi_max_steps']} steps"
        )
    elif dual["reached_001"]:
        fastest = min(reached_001, key=lambda s: s["reached_001"]["seconds"])
        ratio += f"; within 0.01 nat: {fastest['reached_001']['seconds'] / dual['seconds']:.2f}"
    else:
        ratio = "autocvi's EM did not get within 0.1 nat of the best ELBO"
    traj = []
    for c in p["autocvi"]:
        points = ", ".join(
            f"({t['amplitude']:.3f}, {t['lengthscale']:.3f})" for t in c["trajectory"][:8]
        )
        traj.append(f"* {c['bound']}: {points}{' ...' if len(c['trajectory']) > 8 else ''}")
    trajectories = "\n".join(traj)
    return f"""# Sparse GP classification (banana, m = 10): hyperparameters by EM against SVI

{D.env_line(p["environment"], "svgp_banana")}

Data: {p["settings"]["data"]}; {p["settings"]["inducing"]}. Amplitude and length-scale are
`numpyro.param` sites starting at (1, 1) (t-SVGP Fig. 1); the model is written with the exact
SVGP conditional and autocvi integrates f into the likelihood's expectation
(`benchmarks/svgp_banana.py`). SVI optimises the same SVGP ELBO (q(u) AutoMultivariateNormal,
unwhitened or whitened) with the params, by Adam. Every row is scored by the exact SVGP ELBO at
its params and q(u); target: {p["settings"]["target"]} ({best:.4f}). Each method
runs first in a fresh process of its own (SVI's seconds: the guide and `svi.init`, the loop's
compilation, then its steps; autocvi's: the `fit` call); autocvi's warm refit is a second
`fit` in that process.

## Ratios: {ratio}

{D.md_table(head, rows)}

## Result: EM trajectories of (amplitude, length-scale), one point per round

{trajectories}
"""


def plot(plt, p):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    best = p["best_elbo"]
    for s in p["svi"]:
        t = s["trace"]
        axes[0].plot(
            [s["setup_s"] + s["compile_s"] + r[1] for r in t],
            [max(best - r[2], 1e-4) for r in t],
            label=f"SVI {s['variant']} lr {s['lr']:g}",
        )
        axes[1].plot(
            [r[3]["amplitude"] for r in t],
            [r[3]["lengthscale"] for r in t],
            lw=0.8,
            label=f"SVI {s['variant']} lr {s['lr']:g}",
        )
    for c, mark in zip(p["autocvi"], ("r*", "m^")):
        axes[0].plot(
            [c["seconds"]],
            [max(best - c["elbo"], 1e-4)],
            mark,
            ms=12,
            label=f"autocvi {c['bound']}",
        )
        tr = [p["settings"]["start"], *c["trajectory"]]
        axes[1].plot(
            [t["amplitude"] for t in tr],
            [t["lengthscale"] for t in tr],
            mark[0] + "o-",
            ms=3,
            label=f"autocvi EM ({c['bound']} bound)",
        )
    axes[0].axhline(0.1, color="grey", ls=":")
    axes[0].set(xlabel="seconds (compilation included)", ylabel="gap to best ELBO", yscale="log")
    axes[1].set(xlabel="amplitude", ylabel="length-scale", title="hyperparameter trajectories")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    return fig


main = D.main_of(run, ["banana"])
