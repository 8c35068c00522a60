"""GP classification hyperparameters chosen by the ELBO: the KL-prox Table 3 protocol.

ionosphere and sonar, 10 random 50/50 splits: per split autocvi fits the GP
(``gp_classification.model``) at all 225 points of the (log l, log sigma) grid, picks the
highest ELBO and reports the test log-loss there, next to the published numbers; and learns
(log l, log sigma) as ``numpyro.param`` sites by variational EM (one ``autocvi.fit`` from the
grid's centre: CVI E-steps, M-steps on the dual bound, ``autocvi.infer.hyper``). The 225 fits
are ``run`` calls of one ``autocvi.CVI``: every kernel after the first is new data of the same
shapes, which ``CVI`` reads without planning or compiling again; two grid points are checked
against ``autocvi.fit``.

    python -m benchmarks gp_hyperparameters[:ionosphere|:sonar] [--quick]
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro

import autocvi
from autocvi import datasets

from . import driver as D
from .gp_classification import JITTER, POINT, log_loss_bits, model, problem, squared_exponential

GRID = np.linspace(-1.0, 6.0, 15)
PUBLISHED = {
    "ionosphere": {"Proximal": (0.230, 0.002), "EP": (0.234, 0.002), "Laplace": (0.285, 0.002)},
    "sonar": {"Proximal": (0.317, 0.004), "EP": (0.341, 0.003), "Laplace": (0.410, 0.002)},
}
PUBLISHED_TIME = {"ionosphere": "3.6 min", "sonar": "63 s"}
SETTINGS = {
    "num_splits": 10,
    "split_seed": "split s uses numpy default_rng(s).permutation; first half trains",
    "autocvi_max_steps": 100,
    "autocvi_tol": 1e-8,
    "kernel": "sigma^2 (exp(-|x-x'|^2 / (2 l^2)) + 1e-5 I)",
    "test_probability": "E[sigmoid(f*)] by 32-node Gauss-Hermite on N(m*, v*)",
    "log_loss": "mean over test points of -log2 p(y*) (bits)",
    "em_start": (2.5, 2.5),
}


kernels = jax.vmap(squared_exponential, (None, None, 0, 0))  # one kernel per grid point


@jax.jit
def test_log_loss(K, Kst, kss, y_test, mean, cov):
    """Test log-loss (bits) of q(f) = N(mean, cov): ``f* | f`` is the GP conditional,
    ``f* = A f + e``, ``A = K*f K^-1`` (KL-prox Eq. 20)."""
    A = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(K), True), Kst.T).T
    var = kss - jnp.sum(A * Kst, axis=1) + jnp.sum((A @ cov) * A, axis=1)
    return log_loss_bits(A @ mean, var, y_test)


def grid_fits(cvi, y, args, max_steps):
    """(ELBO, iterations, test log-loss, seconds) at every kernel of ``args`` (training
    labels ``y``), each fit by ``cvi.run`` to autocvi's stopping rule. Every kernel after
    the first is new data of the same shapes: ``CVI`` reads a Gaussian prior's Cholesky
    factor as an input, so it neither plans nor compiles again (docs/compilation.md)."""
    out = []
    for g, (K, Kst, kss, y_test) in enumerate(zip(*args)):
        t = time.perf_counter()
        r = cvi.run(g, max_steps, K=K, y=y)
        q = cvi.get_posterior(r.state)["f"]
        loss = float(test_log_loss(K, Kst, kss, y_test, q.mean, q.covariance_matrix))
        out.append((float(r.elbo[-1]), int(r.num_steps), loss, time.perf_counter() - t))
    return [np.asarray(a) for a in zip(*out)]


def em_model(X, y, start=(2.5, 2.5)):
    """The GP classifier with (log l, log sigma) as params: what a user writes to learn them."""
    log_l = numpyro.param("log_lengthscale", start[0])
    log_sd = numpyro.param("log_sd", start[1])
    K = squared_exponential(X, X, log_l, log_sd) + JITTER * jnp.exp(2 * log_sd) * jnp.eye(len(X))
    model(K, y)  # f ~ N(0, K), y ~ Bernoulli(logits=f) in a plate


def em_fit(Xtr, ytr, Xte, yte, start):
    """Variational EM from ``start``: the learned point, ELBO, test log-loss and seconds
    (one cold ``autocvi.fit``: trace, plan, compilation and every round)."""
    data = {"X": Xtr, "y": ytr, "start": start}
    (seconds,), r = D.timed(lambda: autocvi.fit(em_model, data, progress_bar=False), 1)
    ll, lsd = float(r.params["log_lengthscale"]), float(r.params["log_sd"])
    _, metric = problem(Xtr, ytr, Xte, yte, ll, lsd)  # the GP predictive of q(f)
    return {
        "point": (ll, lsd),
        "elbo": float(r.elbo[-1]),
        "test_log_loss_bits": float(metric(r.posterior)),
        "seconds": seconds,
        "rounds": int(r.em.rounds),
        "iterations": int(r.num_steps),
        "converged": bool(r.converged),
    }


def fit_split(name, s, X, y, st, cvi):
    """The 225 fits of split ``s``: one record."""
    log_ls, log_sds = (jnp.asarray(a.ravel()) for a in np.meshgrid(GRID, GRID, indexing="ij"))
    tr, te = np.split(np.random.default_rng(s).permutation(len(y)), [len(y) // 2])
    Xtr, Xte, ytr, yte = (jnp.asarray(a) for a in (X[tr], X[te], y[tr], y[te]))
    sd2, G = jnp.exp(2 * log_sds), len(log_ls)
    Ktr = kernels(Xtr, Xtr, log_ls, log_sds) + (JITTER * sd2)[:, None, None] * jnp.eye(len(tr))
    kss = jnp.broadcast_to(sd2[:, None], (G, len(te)))
    args = (Ktr, kernels(Xte, Xtr, log_ls, log_sds), kss, jnp.broadcast_to(yte, (G, len(te))))
    final, steps, losses, seconds = grid_fits(cvi, ytr, args, st["autocvi_max_steps"])
    point = lambda g: (float(log_ls[g]), float(log_sds[g]))  # noqa: E731
    best, oracle = int(np.nanargmax(final)), int(np.nanargmin(losses))
    capped = steps >= st["autocvi_max_steps"]
    rec = {"split": s, "first_fit_time": float(seconds[0]), "grid_time": float(seconds.sum())}
    rec.update(final_elbo=final, test_log_loss_bits=losses, steps=steps)
    rec["median_steps"] = float(np.median(steps))
    rec["chosen"] = {"point": point(best), "elbo": float(final[best]), "steps": int(steps[best])}
    rec["chosen"]["test_log_loss_bits"] = float(losses[best])
    rec["oracle"] = {"point": point(oracle), "test_log_loss_bits": float(losses[oracle])}
    rec["capped"] = (int(capped.sum()), float(final[capped].max()) if capped.any() else None)
    rec["em"] = em_fit(Xtr, ytr, Xte, yte, st["em_start"])
    if s == 0:  # the grid's fixed points against autocvi.fit at the chosen and the paper's point
        (l0, sd0), rec["check_against_fit"] = POINT[name], []
        paper = int(np.argmin(np.abs(log_ls - l0) + np.abs(log_sds - sd0)))
        for g in dict.fromkeys([best, paper]):
            f = D.timed_fit(model, {"K": Ktr[g], "y": ytr}, num_steps=500)
            keys = ("elbo", "final_elbo_engine"), ("num_steps", "num_steps"), ("converged",) * 2
            check = {"point": point(g), "grid_elbo": float(final[g])}
            rec["check_against_fit"].append(check | {f"fit_{k}": f[v] for k, v in keys})
    print(
        f"[gp_hyperparameters:{name}] split {s}: chose {point(best)}, log-loss {losses[best]:.3f}"
    )
    return rec


def run(name, quick=False):
    jax.config.update("jax_enable_x64", True)
    st = dict(SETTINGS, num_splits=2 if quick else 10)
    d = datasets.load(name)
    X = np.concatenate([d["X"], d["X_te"]]).astype(np.float64)
    y = (np.concatenate([np.ravel(d["y"]), np.ravel(d["y_te"])]) > 0).astype(np.float64)
    # One CVI for every split and grid point: the splits' training sets have one size.
    cvi = autocvi.CVI(model, tol=st["autocvi_tol"])
    splits = [fit_split(name, s, X, y, st, cvi) for s in range(st["num_splits"])]
    summary = {}
    for key, what in zip(("test", "oracle", "em"), ("chosen", "oracle", "em")):
        a = np.array([r[what]["test_log_loss_bits"] for r in splits])
        summary[f"{key}_log_loss_bits_mean"] = float(a.mean())
        summary[f"{key}_log_loss_bits_se"] = float(a.std(ddof=1) / np.sqrt(len(a)))
    summary["em_seconds_mean"] = float(np.mean([r["em"]["seconds"] for r in splits]))
    summary["em_above_grid"] = sum(r["em"]["elbo"] >= r["chosen"]["elbo"] for r in splits)
    summary["em_converged"] = sum(r["em"]["converged"] for r in splits)
    for k in ("grid_time", "first_fit_time"):
        summary[k + "_mean"] = float(np.mean([r[k] for r in splits]))
    data = f"{name}.npz, shipped train and test parts joined: N = {len(y)}, D = {X.shape[1]}"
    out = {"data": data, "splits": splits, "summary": summary}
    out["published_kl_prox_table3"] = PUBLISHED[name]
    return D.publish(f"gp_hyperparameters_{name}", st, markdown, grid_plot, **out)


def _pt(p):
    return f"({p[0]:.1f}, {p[1]:.1f})"


def _oracle(k, r):
    return f"{r['oracle']['test_log_loss_bits']:.3f} at {_pt(r['oracle']['point'])}"


def _capped(k, r):
    n, best = r["capped"]
    return f"{n}" + ("" if best is None else f" ({best:.1f})")


SPLIT_COLUMNS = [
    ("split", "split", "d"),
    ("chosen (log l, log sigma)", lambda k, r: _pt(r["chosen"]["point"]), None),
    ("ELBO at chosen", D.at("chosen", "elbo"), ".3f"),
    ("iterations at chosen", D.at("chosen", "steps"), "d"),
    ("test log-loss (bits)", D.at("chosen", "test_log_loss_bits"), ".3f"),
    ("grid minimum of test log-loss (oracle)", _oracle, None),
    ("median iterations over grid", "median_steps", ".0f"),
    ("grid points at the iteration cap (their best ELBO)", _capped, None),
    ("EM (log l, log sigma)", lambda k, r: _pt(r["em"]["point"]), None),
    ("EM ELBO", D.at("em", "elbo"), ".3f"),
    ("EM test log-loss (bits)", D.at("em", "test_log_loss_bits"), ".3f"),
    ("EM rounds", D.at("em", "rounds"), "d"),
    ("EM s (cold fit)", D.at("em", "seconds"), ".1f"),
    ("225 fits s", "grid_time", ".1f"),
    ("first fit s", "first_fit_time", ".2f"),
]


def markdown(p):
    st, sm, name = p["settings"], p["summary"], p["benchmark"].split("_")[-1]
    n = st["num_splits"]
    grid = sm["grid_time_mean"]

    def row(label, key):  # mean (se) over at least two splits
        mean, se = sm[key + "_mean"], sm[key + "_se"]
        return label, f"{mean:.3f} ({se:.3f})", f"{mean * np.log(2):.3f}"

    rows = [
        row("**autocvi, hyperparameters by the ELBO**", "test_log_loss_bits"),
        row("autocvi, grid minimum (oracle: looks at the test set)", "oracle_log_loss_bits"),
        row("**autocvi, hyperparameters learned by variational EM**", "em_log_loss_bits"),
    ]
    rows += [
        (f"{k} (KL-prox Table 3, as published)", f"{m:.3f} ({se:.3f})", "")
        for k, (m, se) in PUBLISHED[name].items()
    ]
    head = ("method", "test log-loss: mean (se) over splits, bits", "same in nats")
    checks = "\n".join(
        f"- {_pt(c['point'])}: grid ELBO {c['grid_elbo']:.6f}, `autocvi.fit` {c['fit_elbo']:.6f} "
        f"({c['fit_num_steps']} iterations, converged={c['fit_converged']})"
        for c in p["splits"][0]["check_against_fit"]
    )
    return f"""# GP classification, hyperparameters by the ELBO ({name}): KL-prox Table 3 protocol

{D.env_line(p["environment"], f"gp_hyperparameters:{name}")}

Data: {p["data"]}; {n} random 50/50 splits. Kernel: {st["kernel"]}, on a 15 x 15
grid of (log l, log sigma) over [-1, 6]^2. Per split autocvi fits the GP at every grid point
(`autocvi.CVI(model, tol={st["autocvi_tol"]:g}).run`, its stopping rule or {st["autocvi_max_steps"]} iterations),
**chooses the highest ELBO** and reports the test log-loss there ({st["log_loss"]}, with
{st["test_probability"]}); float64.

## Result

{D.md_table(head, rows)}

The paper states neither its log-loss unit nor whether it reports the ELBO-chosen point or
the grid minimum; both of ours are shown. Per split, the 225 fits take {sm["grid_time_mean"]:.1f}
s, each a `run` of one `autocvi.CVI` and its `get_posterior` (the first fit of the first
split traced, planned and compiled: {p["splits"][0]["first_fit_time"]:.1f} s; every later kernel is new
data of the same shapes, read without planning or compiling again); the
paper reports {PUBLISHED_TIME[name]} for its Proximal method (MATLAB, another machine).

Variational EM (the two as `numpyro.param` sites, one `autocvi.fit` from {_pt(st["em_start"])}; \
docs/hyperparameters.md) takes {sm["em_seconds_mean"]:.1f} s
per split, cold (trace, plan, compilation, every round), against the grid's {grid:.1f} s \
(ratio {sm["em_seconds_mean"] / grid:.2f});
its ELBO is at or above the grid's best on {sm["em_above_grid"]} of {n} splits, and \
{sm["em_converged"]} of {n} fits report `converged=True`.

The grid's fixed points against `autocvi.fit` at single grid points (split 0):
{checks}

## Per split

{D.table(SPLIT_COLUMNS, {r["split"]: r for r in p["splits"]})}
"""


def grid_plot(plt, p):
    r0, n, name = p["splits"][0], len(GRID), p["benchmark"].split("_")[-1]
    elbo = np.asarray(r0["final_elbo"], float).reshape(n, n)
    loss = np.asarray(r0["test_log_loss_bits"], float).reshape(n, n)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    titles = ("ELBO (training half; floor max - 200)", "test log-loss, bits (capped at 1)")
    zs = (np.maximum(elbo, np.nanmax(elbo) - 200), np.minimum(loss, 1.0))
    for ax, z, title in zip(axes, zs, titles):
        im = ax.imshow(z.T, origin="lower", extent=(GRID[0], GRID[-1]) * 2, aspect="auto")
        fig.colorbar(im, ax=ax)
        ax.plot(*r0["chosen"]["point"], "r*", ms=14, label="chosen by ELBO")
        ax.set(xlabel="log lengthscale", ylabel="log signal sd", title=title)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"GP classification, {name}, split 0: the 15 x 15 grid")
    return fig


main = D.main_of(run, ["ionosphere", "sonar"])
