"""Run benchmarks: ``python -m benchmarks [name[:part] ...] [--quick]``.

``part`` selects one data set of a benchmark with several (e.g.
``gp_classification:digits35``).

With no names every benchmark runs. ``--quick`` shrinks step counts and Monte
Carlo sizes for a smoke test (results are then not representative, and are
still written to ``benchmarks/results/``).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time

BENCHMARKS = (
    "conjugacy_table",
    "logistic_regression",
    "gp_classification",
    "gp_hyperparameters",
    "gaussian_mixture",
    "factor_models",
    "zoo",
    "cold_start",  # the zoo's runs, as issue 14's table (writes both)
    "report",  # last: docs/benchmarks.md from the results above
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sys.stdout.reconfigure(line_buffering=True)
    flags = [a for a in argv if a.startswith("-")]
    # `python -m benchmarks` runs the suite of docs/benchmarks.md; the zoo (about an hour,
    # also giving cold_start's table) runs on request.
    on_request = ("zoo", "cold_start")
    names = [a for a in argv if not a.startswith("-")] or [
        b for b in BENCHMARKS if b not in on_request
    ]
    if "-h" in flags or "--help" in flags:
        print(__doc__)
        print("available:", ", ".join(BENCHMARKS))
        return 0
    unknown = [n for n in names if n.split(":")[0] not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(BENCHMARKS)}")
        return 2
    if len(names) > 1:
        # One process per benchmark: each sets its own JAX configuration (float64
        # for the GPs), which must not leak into the next one's timings or dtypes.
        t_all = time.perf_counter()
        failed = []
        for name in names:
            code = subprocess.call([sys.executable, "-m", "benchmarks", name, *flags])
            if code:  # keep going: one failure must not stop the other tables
                print(f"[{name}] failed with exit code {code}")
                failed.append(name)
        print(f"[all] {len(names)} benchmarks done in {time.perf_counter() - t_all:.1f} s")
        return 1 if failed else 0
    name, _, part = names[0].partition(":")
    module = importlib.import_module(f"benchmarks.{name}")
    t0 = time.perf_counter()
    module.main(flags + ([part] if part else []))
    print(f"[{name}] done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
