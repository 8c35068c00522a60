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
