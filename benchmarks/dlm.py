"""Direct loss minimisation for sparse GP regression (DLM paper, Sec. 5; issue 16).

Four regression data sets (bundled with autocvi or scikit-learn; offline stand-ins for the
paper's UCI sets where they differ): Boston housing, airfoil self-noise, the motorcycle
data and scikit-learn's diabetes. Each is split 67/8/25 (train/validation/test, seed 0) and
standardised with the training statistics, as in the paper. The model is the SVGP written
as a user writes it (``benchmarks.svgp_uci.svgp``: m = 50 inducing inputs, ARD kernel,
Gaussian noise); its kernel, noise and inducing inputs are first learned by autocvi's
variational EM on the ELBO and then held for every objective (the paper learns them per
objective; this isolates the objective's effect on q(u)).

Objectives: the ELBO; the beta-ELBO and log-loss DLM with beta chosen on the validation
split from every other value of the paper's grid ``n, n/2, ..., 0.01``
(``autocvi.beta_grid``), by the exact validation NLPD; square-loss DLM (``DLM(beta,
loss="square")``: the prior's covariance, the mean under noise variance beta) with beta
chosen by the validation squared error, the loss it is fitted for. Scores on the test split: NLPD,
squared error of the predictive mean, and the coverage of the central 90% predictive
interval. At DLM's chosen beta, autocvi's natural-gradient steps are compared with the
paper's training, Adam (learning rate 0.01, whitened q(u) = N(m, L L^T) on
``v = chol(Kuu)^-1 u``, the closed-form objective ``sum_n log N(y_n | mu_n, v_n + s^2)
- beta KL``), by iterations to the Adam run's final test NLPD (both first hits refined to
single iterations). Float64, one process.

    python -m benchmarks dlm [--quick]
"""

from __future__ import annotations

import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro import handlers
from scipy import stats

import autocvi

from . import driver as D
from . import svgp_uci as S

SETTINGS = {
    "split": "67/8/25 train/validation/test, seed 0; inputs and targets standardised by train",
    "model": "SVGP (benchmarks.svgp_uci.svgp), m = 50 inducing inputs, ARD kernel, noise",
    "hyperparameters": "learned by autocvi's EM on the ELBO, then held for every objective",
    "beta_grid": "every other value of autocvi.beta_grid(n) (n, n/4, n/16, ..., 0.01)",
    "adam": {"learning_rate": 0.01, "steps": 20000, "score_every": 100},
    "target": "within 0.001 nats of Adam's final test NLPD",
    "first_hit": "the first scored point at the target (Adam: every 100 steps; autocvi: marks "
    "1.4x apart, each a fit resumed at the one before), refined to single iterations after the "
    "point before it",
}
DATASETS = ("housing", "airfoil", "mcycle", "diabetes_sklearn")


def load(name):
    if name == "airfoil":
        return S.load("airfoil")
    if name == "diabetes_sklearn":
        from sklearn.datasets import load_diabetes

        X, y = load_diabetes(return_X_y=True)
        return X, y
    raw = autocvi.datasets.load(name)
    if name == "mcycle":
        return raw["data"][:, :1], raw["data"][:, 1]
    return np.asarray(raw["X"], float), np.asarray(raw["y"], float).ravel()


def splits(X, y, scale_targets=True):
    """67/8/25 train/validation/test (seed 0), standardised by the training rows (the
    targets only when ``scale_targets``: labels and counts keep their values)."""
    idx = np.random.RandomState(0).permutation(len(y))
    n_tr, n_va = int(0.67 * len(y)), int(0.08 * len(y))
    tr, va, te = np.split(idx, [n_tr, n_tr + n_va])
    mx, sx = X[tr].mean(0), X[tr].std(0) + 1e-12
    my, sy = (y[tr].mean(), y[tr].std()) if scale_targets else (0.0, 1.0)
    return [((X[i] - mx) / sx, (y[i] - my) / sy) for i in (tr, va, te)]


def scores(p, mean, cov, X, y):
    """Test NLPD, squared error and the coverage of the central 90% interval."""
    mu, var = S.marginals(p, mean, cov, X)
    sd = np.sqrt(var + float(p["noise"]) ** 2)
    nlpd = float(-np.mean(stats.norm.logpdf(y, mu, sd)))
    inside = np.abs(y - mu) <= stats.norm.ppf(0.95) * sd
    return nlpd, float(np.mean((y - mu) ** 2)), float(np.mean(inside))


def q_of(result):
    q = result.posterior["u"]
    return np.asarray(q.mean), np.asarray(q.covariance_matrix)


def adam_record(natural, adam, ng_hit, adam_hit) -> dict:
    """A data set's record of the natural-gradient against Adam comparison."""
    return {
        "adam_final_test_nlpd": adam[-1][1],
        "natural_gradient_iterations_to_target": ng_hit,
        "adam_iterations_to_target": adam_hit,
        "iteration_ratio": (adam_hit / ng_hit) if ng_hit and adam_hit else None,
        "natural_gradient_trace": natural,
        "adam_trace": adam,
    }


def resumer(model, data, objective, score, **options):
    """``resume(state, n) -> (state, score(result))``: ``n`` more iterations of ``fit``
    (from the start when ``state`` is None), every one run (``tol=0``)."""

    def resume(state, n):
        result = autocvi.fit(
            model,
            data,
            objective=objective,
            num_steps=n,
            init_state=state,
            tol=0.0,
            progress_bar=False,
            learn_params=False,
            **options,
        )
        return result.state, score(result)

    return resume


def natural_gradient_trace(model, data, objective, score, max_steps):
    """autocvi's ``score(result)`` after 1, 2, 3, 5, ... natural-gradient iterations (each
    mark a fit resumed at the one before), and ``steps(k, n)``: the score after 1, ..., ``n``
    iterations resumed at mark ``k``."""
    resume = resumer(model, data, objective, score)

    marks = sorted({int(round(1.4**k)) for k in range(40)} | {max_steps})
    rows, states, done = [], {0: None}, 0
    for k in [k for k in marks if k <= max_steps]:
        states[k], value = resume(states[done], k - done)
        rows.append((k, value))
        done = k

    def steps(k, n):  # runs of 1..n iterations resumed at mark k, as each mark is
        return [resume(states[k], j)[1] for j in range(1, n + 1)]

    return rows, steps


def autocvi_adam_trace(model, data, objective, score, lr, steps, every):
    """The paper's training by autocvi's own option (``fit(..., optimizer=optax.adam(lr))``:
    Adam on q(u)'s mean and Cholesky factor, whitened): ``score(result)`` every ``every``
    steps (each a fit resumed at the one before), and ``hit(target)``: the first step whose
    score is at most ``target``, refined to single steps (by 10-step runs first)."""
    resume = resumer(model, data, objective, score, optimizer=optax.adam(lr))

    rows, kept, state = [], {0: None}, None
    for k in range(1, steps // every + 1):
        state, value = resume(state, every)
        kept[k * every] = state
        rows.append((k * every, value))

    def hit(target):
        first = next((i for i, (_, v) in enumerate(rows) if v <= target), None)
        if first is None:
            return None
        before = rows[first - 1][0] if first else 0
        state = kept[before]
        for j in range(0, every, 10):
            after, value = resume(state, 10)
            if value <= target or j + 10 >= every:
                single = (resume(state, i)[1] for i in range(1, 11))
                return before + j + next((i + 1 for i, v in enumerate(single) if v <= target), 10)
            state = after
        return rows[first][0]

    return rows, hit


def first_hit(trace, target, steps):
    """The first iteration whose test NLPD is at most ``target``: the first mark of
    ``trace`` that is, refined to single iterations after the mark before it (``steps``)."""
    i = next((i for i, (_, v) in enumerate(trace) if v <= target), None)
    if i is None:
        return None
    before = trace[i - 1][0] if i else 0
    values = steps(before, trace[i][0] - before)
    return before + next(j + 1 for j, v in enumerate(values) if v <= target or j == len(values) - 1)


def adam_trace(p, Xtr, ytr, Xte, yte, beta, lr, steps, every):
    """The paper's training: Adam on the closed-form log-loss DLM objective (whitened)."""
    Kuu, A, residual = S.conditional(p, jnp.asarray(Xtr))
    L = jnp.linalg.cholesky(Kuu)
    B = A @ L  # f = B v + residual noise
    s2 = float(p["noise"]) ** 2
    m = B.shape[1]
    y = jnp.asarray(ytr)

    def unpack(theta):
        tril = jnp.tril(theta["L"], -1) + jnp.diag(jnp.exp(jnp.diag(theta["L"])))
        return theta["m"], tril

    def loss(theta):
        mv, Lv = unpack(theta)
        mu = B @ mv
        var = jnp.sum((B @ Lv) ** 2, -1) + residual + s2
        kl = 0.5 * (jnp.sum(Lv**2) + mv @ mv - m - 2 * jnp.sum(jnp.log(jnp.diag(Lv))))
        return -(jnp.sum(jax.scipy.stats.norm.logpdf(y, mu, jnp.sqrt(var))) - beta * kl)

    opt = optax.adam(lr)
    theta = {"m": jnp.zeros(m), "L": jnp.zeros((m, m))}
    state = opt.init(theta)

    @partial(jax.jit, static_argnums=2)
    def chunk(theta, state, n):
        def body(c, _):
            t, s = c
            g = jax.grad(loss)(t)
            u, s = opt.update(g, s, t)
            return (optax.apply_updates(t, u), s), None

        return jax.lax.scan(body, (theta, state), None, n)[0]

    def score(theta):
        mv, Lv = unpack(theta)
        mean = np.asarray(L @ mv)
        cov = np.asarray(L @ Lv @ Lv.T @ L.T)
        return scores(p, mean, cov, Xte, yte)[0]

    rows, kept = [], {0: (theta, state)}
    for k in range(steps // every):
        theta, state = chunk(theta, state, every)
        kept[(k + 1) * every] = (theta, state)
        rows.append(((k + 1) * every, score(theta)))

    def single_steps(k, n):  # the test NLPD after each of n single steps from step k
        (theta, state), out = kept[k], []
        for _ in range(n):
            theta, state = chunk(theta, state, 1)
            out.append(score(theta))
        return out

    return rows, single_steps


def run_dataset(name, quick):
    X, y = load(name)
    (Xtr, ytr), (Xva, yva), (Xte, yte) = splits(X, y)
    m = min(S.M, len(ytr) // 2)
    Z0 = Xtr[np.random.RandomState(0).permutation(len(ytr))[:m]]
    data = {"X": Xtr, "Z0": Z0, "y": ytr, "regression": True}
    t = time.perf_counter()
    learned = autocvi.fit(S.svgp, data, progress_bar=False)
    p = {k: np.asarray(v) for k, v in learned.params.items()}
    em_seconds = time.perf_counter() - t
    fixed = handlers.substitute(S.svgp, data=dict(p))
    grid = autocvi.beta_grid(len(ytr))[::2]
    if quick:
        grid = grid[::3]
    rows = {}
    # (label, objective of beta, the validation score that chooses beta: 0 NLPD, 1 squared error)
    for label, make, chosen_by in (
        ("ELBO", None, 0),
        ("beta-ELBO", autocvi.BetaELBO, 0),
        ("DLM, log loss", autocvi.DLM, 0),
        ("DLM, square loss", lambda b: autocvi.DLM(b, loss="square"), 1),
    ):
        best = None
        for beta in [None] if make is None else grid:
            kwargs = {} if make is None else {"objective": make(float(beta))}
            t = time.perf_counter()
            result = autocvi.fit(
                fixed, data, progress_bar=False, learn_params=False, num_steps=2000, **kwargs
            )
            seconds = time.perf_counter() - t
            mean, cov = q_of(result)
            valid = scores(p, mean, cov, Xva, yva)[chosen_by]
            if best is None or valid < best["valid_score"]:
                test = scores(p, mean, cov, Xte, yte)
                best = {
                    "beta": beta,
                    "valid_score": valid,
                    "chosen_by": ("validation NLPD", "validation squared error")[chosen_by],
                    "test_nlpd": test[0],
                    "test_se": test[1],
                    "coverage90": test[2],
                    "iterations": int(result.num_steps),
                    "converged": bool(result.converged),
                    "seconds": seconds,
                }
        rows[label] = best
    beta = rows["DLM, log loss"]["beta"]
    st = SETTINGS["adam"]
    steps = 2000 if quick else st["steps"]
    adam, adam_steps = adam_trace(
        p, Xtr, ytr, Xte, yte, beta, st["learning_rate"], steps, st["score_every"]
    )
    target = adam[-1][1] + 1e-3
    natural, ng_steps = natural_gradient_trace(
        fixed, data, autocvi.DLM(beta=beta), lambda r: scores(p, *q_of(r), Xte, yte)[0], 2000
    )
    # both first hits refined to single iterations (Adam is scored every score_every steps,
    # autocvi at marks 1.4x apart)
    ng_hit, adam_hit = first_hit(natural, target, ng_steps), first_hit(adam, target, adam_steps)
    record = {
        "data": name,
        "n_train": len(ytr),
        "n_test": len(yte),
        "inputs": X.shape[1],
        "em_seconds": em_seconds,
        "params": {k: np.asarray(v).tolist() for k, v in p.items() if k != "Z"},
        "objectives": rows,
        **adam_record(natural, adam, ng_hit, adam_hit),
    }
    print(f"[{name}] {rows}\n  NG to target {ng_hit}, Adam {adam_hit}")
    return record


def run(quick=False):
    jax.config.update("jax_enable_x64", True)
    records = [run_dataset(name, quick) for name in DATASETS]
    return D.publish("dlm", dict(SETTINGS, quick=quick), markdown, plot, datasets=records)


def markdown(p):
    env = D.env_line(p["environment"], "dlm")
    lines = [
        "# Direct loss minimisation for sparse GP regression (DLM paper, Sec. 5)",
        "",
        env,
        "",
        "Settings: " + "; ".join(f"{k}: {v}" for k, v in p["settings"].items()),
        "",
        *objective_rows(
            p,
            lambda r: f"{r['data']} (n = {r['n_train']})",
            {"test NLPD": "{test_nlpd:.4f}", "test squared error": "{test_se:.4f}"}
            | {"90% coverage": "{coverage90:.3f}"},
        ),
    ]
    return "\n".join(lines + ["", *adam_table(p, "test NLPD")])


def adam_table(p, metric: str) -> list[str]:
    """Per data set: Adam's final ``metric`` and the iterations each training needs to it."""
    ratios = ", ".join(
        f"{r['data']} "
        + (f"{r['iteration_ratio']:.1f}" if r["iteration_ratio"] is not None else "—")
        for r in p["datasets"]
    )
    lines = [
        f"## Ratios: Adam iterations / natural-gradient iterations to Adam's final {metric} "
        f"(+0.001): {ratios}",
        "",
        f"| data | DLM beta | Adam's final {metric} (after its steps) | natural-gradient "
        "iterations to it | Adam iterations to it | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for r in p["datasets"]:
        o = r["objectives"]["DLM, log loss"]
        ratio = "—" if r["iteration_ratio"] is None else f"{r['iteration_ratio']:.1f}"
        lines.append(
            f"| {r['data']} | {o['beta']:.3g} | {r['adam_final_test_nlpd']:.4f} "
            f"({r['adam_trace'][-1][0]}) | {r['natural_gradient_iterations_to_target']} | "
            f"{r['adam_iterations_to_target']} | {ratio} |"
        )
    return lines


def objective_rows(p, data_label, scores: dict) -> list[str]:
    """A markdown table with one row per (data set, objective): data, objective, beta,
    the ``scores`` (header -> format of the objective's record), iterations, converged
    and seconds."""
    head = ["data", "objective", "beta", *scores, "iterations", "converged", "seconds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in p["datasets"]:
        for label, o in r["objectives"].items():
            beta = "—" if o["beta"] is None else f"{o['beta']:.3g}"
            cells = [data_label(r), label, beta, *(f.format(**o) for f in scores.values())]
            cells += [str(o["iterations"]), str(o["converged"]), f"{o['seconds']:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot(plt, p, metric="test NLPD", adam="Adam DLM (the paper's training)"):
    panels = []
    for r in p["datasets"]:
        ng = np.asarray(r["natural_gradient_trace"], float)
        trace = np.asarray(r["adam_trace"], float)
        panels.append(
            {
                "lines": [
                    (ng[:, 0], ng[:, 1], "autocvi DLM (natural gradient)", "o-"),
                    (trace[:, 0], trace[:, 1], adam, "-"),
                ],
                "xlabel": "iterations",
                "ylabel": metric,
                "log": "x",
                "title": f"{r['data']}, beta = {r['objectives']['DLM, log loss']['beta']:.3g}",
                "hlines": [(r["adam_final_test_nlpd"], ":")],
            }
        )
    return D.plot(plt, panels, "log-loss DLM: natural-gradient steps against Adam")


def main(argv=None):
    run(quick="--quick" in (argv or []))


if __name__ == "__main__":
    main()
