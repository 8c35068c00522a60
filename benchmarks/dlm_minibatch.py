"""Direct loss minimisation with minibatches on 100,000 points (DLM paper, Sec. 6 "Non-conjugate
DLM on a large dataset"; issue 16).

The paper's large experiment is the airline data (2 M points, m = 200, B = 1,000, 20 epochs
of Adam) with beta in {0.1, 1, 10} and no beta selection, reported as test log loss against
epochs. The offline stand-in is the synthetic binary task of
``examples/minibatch_sparse_gp.py`` (100,000 training and 10,000 test points, m = 50 fixed
inducing inputs, a fixed kernel, B = 1,000), the model as the example writes it (the exact
SVGP conditional in a subsampled plate). For each beta: the beta-ELBO and log-loss DLM by
autocvi's natural-gradient steps, and DLM by Adam (``fit(..., optimizer=optax.adam(0.01))``,
20 epochs = 2,000 steps; the paper's training). Scores: test NLL against iterations (each
point a fit resumed at the one before); iterations to Adam's final test NLL (+0.001). Float32
(what users get), one process.

    python -m benchmarks dlm_minibatch [--quick]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import autocvi

from . import dlm
from . import driver as D

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from minibatch_sparse_gp import inducing_inputs, make_data, svgp, test_nlpd  # noqa: E402

SETTINGS = {
    "data": "synthetic (examples/minibatch_sparse_gp.py): 100,000 train + 10,000 test, 2 inputs",
    "model": "SVGP, m = 50 fixed inducing inputs (a random subset), fixed kernel, B = 1,000",
    "betas": [0.1, 1.0, 10.0],
    "natural_gradient_max_steps": 400,
    "adam": {"learning_rate": 0.01, "steps": 2000, "score_every": 100},
    "target": "within 0.001 nats of Adam's final test NLL",
}


def run(quick=False):
    st = dict(SETTINGS)
    n = 20_000 if quick else 100_000
    if quick:
        st.update(betas=[1.0], adam={"learning_rate": 0.01, "steps": 400, "score_every": 100})
    X, y = make_data(n + 10_000)
    (X, y), (X_test, y_test) = (X[:n], y[:n]), (X[n:], y[n:])
    data = {"X": X, "Z": inducing_inputs(X, 50), "y": y, "batch_size": 1000}

    def score(result):
        q = result.posterior["u"]
        return float(test_nlpd(q.mean, q.covariance_matrix, data["Z"], X_test, y_test))

    records = []
    for beta in st["betas"]:
        rows = {}
        for label, objective in (
            ("beta-ELBO", autocvi.BetaELBO(beta)),
            ("DLM, log loss", autocvi.DLM(beta)),
        ):
            t = time.perf_counter()
            result = autocvi.fit(
                svgp, data, objective=objective, num_steps=3000, progress_bar=False
            )
            rows[label] = {
                "beta": beta,
                "test_nll": score(result),
                "iterations": int(result.num_steps),
                "converged": bool(result.converged),
                "seconds": time.perf_counter() - t,
            }
        a = st["adam"]
        objective = autocvi.DLM(beta)
        t = time.perf_counter()
        adam, adam_hit = dlm.autocvi_adam_trace(
            svgp, data, objective, score, a["learning_rate"], a["steps"], a["score_every"]
        )
        adam_seconds = time.perf_counter() - t
        target = adam[-1][1] + 1e-3
        natural, ng_steps = dlm.natural_gradient_trace(
            svgp, data, objective, score, st["natural_gradient_max_steps"]
        )
        ng_hit, adam_hit = dlm.first_hit(natural, target, ng_steps), adam_hit(target)
        rows["DLM, log loss, Adam"] = {
            "beta": beta,
            "test_nll": adam[-1][1],
            "iterations": adam[-1][0],
            "converged": False,
            "seconds": adam_seconds,
        }
        print(f"[beta = {beta}] {rows}\n  NG to target {ng_hit}, Adam {adam_hit}")
        records.append(
            {
                "data": f"beta = {beta:g}",
                "n_train": n,
                "objectives": rows,
                **dlm.adam_record(natural, adam, ng_hit, adam_hit),
            }
        )
    return D.publish("dlm_minibatch", dict(st, quick=quick), markdown, plot, datasets=records)


def markdown(p):
    lines = [
        "# Direct loss minimisation with minibatches on 100,000 points (DLM paper, Sec. 6)",
        "",
        D.env_line(p["environment"], "dlm_minibatch"),
        "",
        "Settings: " + "; ".join(f"{k}: {v}" for k, v in p["settings"].items()),
        "",
        "## Results: test NLL",
        "",
        *dlm.objective_rows(
            p, lambda r: f"{r['data']} (n = {r['n_train']})", {"test NLL": "{test_nll:.4f}"}
        ),
        "",
        *dlm.adam_table(p, "test NLL"),
    ]
    return "\n".join(lines)


def plot(plt, p):
    return dlm.plot(plt, p, "test NLL", "Adam DLM (autocvi optimizer=)")


def main(argv=None):
    run(quick="--quick" in (argv or []))


if __name__ == "__main__":
    main()
