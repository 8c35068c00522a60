"""Helpers of the sparse-GP benchmarks (``svgp_*``, ``gp_regression_em``), added after the
driver: NumPyro SVI run in compiled chunks, and the test-NLPD targets of the SVGP runs."""

import jax
import numpy as np

from .driver import timed


def svi_in_chunks(svi, state, chunk, max_steps, score, *args, stop=None, **kwargs):
    """NumPyro SVI run the fastest way a user can: ``chunk`` steps of ``svi.update(state,
    *args, **kwargs)`` compiled once (ahead of time) as one ``lax.scan``, run up to
    ``max_steps // chunk`` times, ``score(state)`` (a tuple) recorded after each chunk.

    Returns ``(compile_s, trace, state)``; trace rows are ``(steps, loop_s, *score)``,
    loop seconds without compilation. ``stop(row)`` true ends the run after that row.
    """

    def steps(state):
        body = lambda s, _: (svi.update(s, *args, **kwargs)[0], None)  # noqa: E731
        return jax.lax.scan(body, state, None, chunk)[0]

    (compile_s,), compiled = timed(lambda: jax.jit(steps).lower(state).compile(), 1)
    trace, loop_s = [], 0.0
    for k in range(max_steps // chunk):
        (dt,), state = timed(lambda s=state: jax.block_until_ready(compiled(s)), 1)
        loop_s += dt
        trace.append(((k + 1) * chunk, loop_s, *score(state)))
        if stop is not None and stop(trace[-1]):
            break
    return compile_s, trace, state


def nlpd_targets(runs, nlpd_at, elbo_at, tolerance, elbo_gap):
    """The test-NLPD target of the SVGP benchmarks, and each run's checkpoints against it.

    ``runs``: dicts with ``method`` and ``trace`` (checkpoints ``(steps, seconds, ...)``,
    the test NLPD at index ``nlpd_at``, the full-data ELBO at ``elbo_at``). The target is
    the best test NLPD of any SVI run plus ``tolerance``; each run gets ``reached`` (the
    first checkpoint at the target), ``reached_elbo`` (the first within ``elbo_gap`` of
    the best finite ELBO) and ``final_elbo``. Returns ``(svi_best, target, best_elbo)``.
    """
    svi = [t[nlpd_at] for r in runs if r["method"].startswith("SVI") for t in r["trace"]]
    svi_best = min(v for v in svi if np.isfinite(v))  # a diverged run's NaN is never best
    target = svi_best + tolerance
    best_elbo = max(t[elbo_at] for r in runs for t in r["trace"] if np.isfinite(t[elbo_at]))

    def first(trace, hit):
        t = next((t for t in trace if hit(t)), None)
        return None if t is None else {"steps": t[0], "seconds": t[1]}

    for r in runs:
        r["reached"] = first(r["trace"], lambda t: t[nlpd_at] <= target)
        r["reached_elbo"] = first(r["trace"], lambda t: t[elbo_at] >= best_elbo - elbo_gap)
        r["final_elbo"] = r["trace"][-1][elbo_at]
    return svi_best, target, best_elbo
