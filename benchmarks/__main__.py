"""Run benchmarks: ``python -m benchmarks [name[:part] ...] [--quick]``.

``part`` selects one data set of a benchmark with several (e.g. ``gp_classification:sonar``).
With no names the suite of ``docs/benchmarks.md`` runs (the zoo and cold_start only on
request). ``--quick`` shrinks step counts and Monte Carlo sizes for a smoke test (results are
then not representative, and are still written to ``benchmarks/results/``).
"""

import importlib
import subprocess
import sys
import time

# The suite of docs/benchmarks.md in order, then the zoo and cold_start (the zoo's runs, as issue
# 14's table: writes both), run on request only; the report last (the page from the results).
BENCHMARKS = """conjugacy_table logistic_regression gp_classification gp_hyperparameters
gp_regression_em svgp_banana svgp_minibatch svgp_multiclass svgp_uci dlm dlm_nonconjugate
dlm_minibatch gaussian_mixture factor_models zoo cold_start report""".split()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sys.stdout.reconfigure(line_buffering=True)
    flags = [a for a in argv if a.startswith("-")]
    names = [a for a in argv if not a.startswith("-")]
    names = names or [b for b in BENCHMARKS if b not in ("zoo", "cold_start")]
    unknown = [n for n in names if n.split(":")[0] not in BENCHMARKS]
    if {"-h", "--help"} & set(flags) or unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)};" if unknown else __doc__)
        print(f"available: {', '.join(BENCHMARKS)}")
        return 2 if unknown else 0
    t0, failed = time.perf_counter(), []
    if len(names) > 1:
        # One process per benchmark: each sets its own JAX configuration (float64 for the
        # GPs); a failure does not stop the others.
        for name in names:
            code = subprocess.call([sys.executable, "-m", "benchmarks", name, *flags])
            if code:
                print(f"[{name}] failed with exit code {code}")
                failed.append(name)
        print(f"[all] {len(names)} benchmarks done in {time.perf_counter() - t0:.1f} s")
        return 1 if failed else 0
    name, _, part = names[0].partition(":")
    module = importlib.import_module(f"benchmarks.{name}")
    module.main(flags + ([part] if part else []))
    print(f"[{name}] done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
