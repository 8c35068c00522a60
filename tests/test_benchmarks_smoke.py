"""The benchmarks still run: one benchmark end to end through the driver, ``--quick``.

Nothing else in the test suite imports ``benchmarks/``, so a change to the public API it
uses (``CVI.init/update/run``, ``get_posterior``) or to the driver could leave
``python -m benchmarks`` broken until the next full run. This runs the logistic-regression
convergence benchmark in a child process, as the README says, with its results written to
a temporary directory (``AUTOCVI_BENCHMARK_RESULTS``), and checks what it measured against
facts that do not depend on timing: autocvi's compiled loop replays its step-by-step
objective (the driver's own check), every method's posterior is scored by the common
estimator, and autocvi reaches 1 nat of the best ELBO in a handful of iterations where SVI
needs hundreds (the benchmark's iteration target).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_logistic_benchmark_runs_quick_and_its_record_is_sane(tmp_path):
    env = {**os.environ, "AUTOCVI_BENCHMARK_RESULTS": str(tmp_path), "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "logistic_regression:convergence", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads((tmp_path / "logistic_regression.json").read_text())
    assert (tmp_path / "logistic_regression.md").exists()
    methods = record["methods"]
    assert {"autocvi", "autocvi-mc"} <= set(methods)
    assert any(name.startswith("svi-") for name in methods)
    for name, rec in methods.items():
        assert rec["checks"].get("fused_objective_matches_steps", True), name
        assert len(rec["elbo"]) == len(rec["iters"]) > 1, name
    one_nat = record["summary"]["1.0"]
    assert one_nat["autocvi"]["iterations"] <= 10
    assert one_nat["iteration_ratio"] >= 50
    # autocvi's final ELBO is the reference (the best of every method) within MC error.
    final = methods["autocvi"]["final"]
    assert abs(final["elbo"] - record["reference"]) <= 5 * final["se"] + 0.01


@pytest.mark.slow
@pytest.mark.float64
def test_gp_hyperparameter_grid_reaches_fits_elbo_at_each_kernel():
    """``benchmarks/gp_hyperparameters.py`` fits 225 kernels with one ``autocvi.CVI`` (each
    kernel new data of the same shapes) and scores q(f) by its own test log-loss. Oracles:
    at each kernel the ELBO ``autocvi.fit`` reaches there, and the log-loss
    ``gp_classification.problem``'s metric gives for ``fit``'s posterior."""
    import jax.numpy as jnp
    import numpy as np

    import autocvi
    from autocvi import datasets
    from benchmarks import gp_hyperparameters as grid
    from benchmarks.gp_classification import JITTER, model, problem, squared_exponential

    d = datasets.load("ionosphere")
    X = np.asarray(d["X"], np.float64)[:50]
    y = (np.ravel(d["y"])[:50] > 0).astype(np.float64)
    Xtr, Xte, ytr, yte = (jnp.asarray(a) for a in (X[:40], X[40:], y[:40], y[40:]))

    def kernels(log_l, log_sd):
        K = squared_exponential(Xtr, Xtr, log_l, log_sd)
        K = K + JITTER * jnp.exp(2 * log_sd) * jnp.eye(len(ytr))
        kss = jnp.full(len(yte), jnp.exp(2 * log_sd))
        return K, squared_exponential(Xte, Xtr, log_l, log_sd), kss, yte

    points = [(1.0, 1.0), (0.5, 2.0)]
    args = [jnp.stack(a) for a in zip(*(kernels(*p) for p in points))]
    cvi = autocvi.CVI(model, tol=1e-8)
    elbos, steps, losses, _ = grid.grid_fits(cvi, ytr, args, 100)
    for g, point in enumerate(points):
        fit = autocvi.fit(model, {"K": args[0][g], "y": ytr}, progress_bar=False)
        assert fit.converged, point
        assert 2 <= steps[g] < 100, point
        assert abs(elbos[g] - float(fit.elbo[-1])) <= 1e-6 * abs(elbos[g]) + 1e-6, point
        _, metric = problem(Xtr, ytr, Xte, yte, *point)
        assert abs(losses[g] - float(metric(fit.posterior))) <= 1e-4, point


def test_a_function_runs_cold_in_a_fresh_process():
    """``driver.in_fresh_process`` (the cold runs of ``svgp_banana``): the call runs in
    another process, from a fresh interpreter (no module this process imported), and
    returns the function's JSON result; a failure names the call."""
    import os

    from benchmarks import driver as D

    assert D.in_fresh_process("math", "hypot", 3.0, 4.0) == 5.0
    assert D.in_fresh_process("os", "getpid") != os.getpid()
    # nothing this process imported: a fresh interpreter, not a fork
    assert "benchmarks.driver" not in D.in_fresh_process(
        "builtins", "eval", "list(__import__('sys').modules)"
    )
    with pytest.raises(RuntimeError, match="math.sqrt"):
        D.in_fresh_process("math", "sqrt", "not a number")
