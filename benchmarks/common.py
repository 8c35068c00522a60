"""Shared machinery for the benchmarks: timing, common ELBO estimator, result files.

Every benchmark runs autocvi and its peers in one process on the same data,
measures compilation separately from the iteration loop, evaluates every
method's posterior with the same high-precision Monte Carlo ELBO estimator,
and writes ``results/<name>.json``, ``results/<name>.md`` and (when matplotlib
is importable) ``results/<name>.png``.

Conventions used throughout:

* "iteration" is one call of the method's step: one CVI sweep over all nodes
  for autocvi, one Adam step for SVI, one VMP sweep for BayesPy.
* "loop time" excludes JIT compilation (both sides are compiled ahead of time
  and the compile time is reported separately) and setup (tracing, planning,
  ``svi.init``), which are also reported separately.
* "time to threshold" is the loop time up to and including the first iteration
  whose posterior is within the threshold of the reference ELBO. For autocvi
  every iteration is timed individually (the loop blocks on the ELBO each
  iteration, as ``autocvi.fit`` does); SVI runs as one fused ``lax.scan``
  (what ``SVI.run(progress_bar=False)`` does), so its time to iteration ``t``
  is ``t / num_steps`` times the measured scan time.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.infer.util import log_density

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


# --------------------------------------------------------------------------- info
def _version(mod: str) -> str | None:
    try:
        return getattr(importlib.import_module(mod), "__version__", "?")
    except Exception:  # noqa: BLE001 - optional packages
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20, check=True
        )
        return out.stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def environment() -> dict:
    """Versions, git state of the engine, machine and JAX backend."""
    dirty = _git("status", "--porcelain", "--", "autocvi")
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {
            m: _version(m)
            for m in ("autocvi", "jax", "jaxlib", "numpyro", "numpy", "sklearn", "bayespy")
        },
        "python": platform.python_version(),
        "git_commit": _git("rev-parse", "HEAD"),
        "autocvi_worktree_dirty": bool(dirty) if dirty is not None else None,
        "autocvi_dirty_files": dirty.splitlines() if dirty else [],
        "machine": {
            "platform": platform.platform(),
            "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "jax_backend": jax.default_backend(),
            "jax_devices": [str(d) for d in jax.devices()],
            "x64": bool(jax.config.jax_enable_x64),
            "XLA_FLAGS": os.environ.get("XLA_FLAGS"),
            "load_average_1_5_15min": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        },
    }


# ------------------------------------------------------------------- estimator
class ELBOEstimator:
    """ELBO of any q by plain Monte Carlo: ``mean_s [log p(x, z_s) - log q(z_s)]``.

    ``log p`` is numpyro's ``log_density`` of ``model(**data)``; ``z_s`` are
    draws from ``q`` made with one fixed key (common random numbers across the
    methods being compared). Draws are processed in chunks under ``jit``; the
    average is taken in float64 on the host.

    Args:
        model: NumPyro model.
        data: model keyword arguments.
        num_samples: Monte Carlo draws.
        rng_key: the key shared by all evaluations.
        chunk: draws per jitted chunk.
    """

    def __init__(self, model, data, num_samples=65536, rng_key=12345, chunk=4096):
        self.model, self.data = model, data
        self.num_samples, self.chunk = num_samples, chunk
        self.key = jax.random.PRNGKey(rng_key) if isinstance(rng_key, int) else rng_key

        def logp(z):
            return log_density(model, (), data, z)[0]

        self._logp = jax.jit(jax.vmap(logp))

    def per_sample(self, sample_and_log_q: Callable) -> np.ndarray:
        """``log p - log q`` per draw; ``sample_and_log_q(key, n) -> (z dict, log q (n,))``."""
        out = []
        for start in range(0, self.num_samples, self.chunk):
            n = min(self.chunk, self.num_samples - start)
            key = jax.random.fold_in(self.key, start)
            z, log_q = sample_and_log_q(key, n)
            lp = self._logp(z)
            out.append(np.asarray(lp, np.float64) - np.asarray(log_q, np.float64))
        return np.concatenate(out)

    def __call__(self, sample_and_log_q: Callable) -> tuple[float, float]:
        """(ELBO estimate, its Monte Carlo standard error)."""
        v = self.per_sample(sample_and_log_q)
        if not np.all(np.isfinite(v)):
            return float("nan"), float("nan")
        return float(v.mean()), float(v.std(ddof=1) / np.sqrt(v.size))


@jax.jit
def _draw_independent(dists: dict, key):
    """One joint draw from a dict of independent Distributions and its log q."""
    names = sorted(dists)
    keys = jax.random.split(key, len(names))
    z, lq = {}, 0.0
    for k, n in zip(keys, names):
        x = dists[n].sample(k)
        z[n] = x
        lq = lq + jnp.sum(dists[n].log_prob(x))
    return z, lq


_draw_independent_batch = jax.jit(jax.vmap(_draw_independent, in_axes=(None, 0)))


def independent_q(dists: dict) -> Callable:
    """``sample_and_log_q`` for a product of numpyro Distributions, one per site.

    The distributions are passed to one jitted function as pytrees, so scoring
    many posteriors of the same structure compiles once.
    """

    def sample_and_log_q(key, n):
        return _draw_independent_batch(dists, jax.random.split(key, n))

    return sample_and_log_q


_GUIDE_DRAWS: dict = {}


def guide_q(guide, params: dict, data: dict, sites: list[str] | None = None) -> Callable:
    """``sample_and_log_q`` for a NumPyro guide at fixed ``params``.

    Runs the guide under ``seed``/``substitute``/``trace`` and sums the log
    densities of its sample sites (values in the constrained space, as the model
    sees them; auxiliary sites such as ``_auto_latent`` count in log q but are
    not returned). Compiled once per guide; ``params`` is an argument.
    """
    cache_key = (id(guide), tuple(sorted(data)), None if sites is None else tuple(sites))
    if cache_key not in _GUIDE_DRAWS:

        def one(p, key):
            tr = handlers.trace(handlers.substitute(handlers.seed(guide, key), data=p)).get_trace(
                **data
            )
            z, lq = {}, 0.0
            for name, site in tr.items():
                if site["type"] != "sample" or site["is_observed"]:
                    continue
                lq = lq + jnp.sum(site["fn"].log_prob(site["value"]))
                if site["infer"].get("is_auxiliary"):
                    continue
                if sites is None or name in sites:
                    z[name] = site["value"]
            return z, lq

        _GUIDE_DRAWS[cache_key] = (guide, jax.jit(jax.vmap(one, in_axes=(None, 0))))
    draw = _GUIDE_DRAWS[cache_key][1]

    def sample_and_log_q(key, n):
        return draw(params, jax.random.split(key, n))

    return sample_and_log_q


# ------------------------------------------------------------------- autocvi
def run_autocvi(
    model,
    data,
    num_steps: int,
    *,
    rng_key=0,
    step_size=None,
    num_samples: int = 16,
    use_quadrature: bool | None = None,
    keep_states: bool = True,
    repeats: int = 3,
    host_sync_loop: bool = True,
) -> dict:
    """Run autocvi's init/step as ``autocvi.fit`` does, timed in parts.

    Builds the schedule (timed as setup), compiles ``init`` and ``step`` ahead
    of time (timed as compile), then runs ``num_steps`` iterations with no
    convergence stop, one jitted step at a time to record every state and ELBO
    (per-step times with a host sync kept as ``iter_times_host_sync``). The
    per-iteration time ``iter_times`` is that of the loop ``fit`` runs: the
    iterations inside one compiled ``lax.scan`` (fastest of ``repeats`` runs,
    divided by ``num_steps``), the same measure used for SVI's ``lax.scan``.

    With ``host_sync_loop=False`` the step-at-a-time loop is skipped (its
    per-call dispatch can cost more than the step for models with large
    constants), the states come from the timed ``lax.scan`` (which stacks
    them), and ``compile_time`` is that of ``init`` and this scan.

    Returns a dict with ``schedule``, ``states`` (after each iteration),
    ``elbo`` (the engine's own ELBO per iteration), ``iter_times``,
    ``setup_time``, ``compile_time``.
    """
    import autocvi
    from autocvi.plan.schedule import build_schedule

    if isinstance(rng_key, int):
        rng_key = jax.random.PRNGKey(rng_key)
    t0 = time.perf_counter()
    graph = autocvi.trace(model, data)
    kwargs = {"num_samples": num_samples, "step_size": step_size}
    if use_quadrature is not None:
        kwargs["use_quadrature"] = use_quadrature
    schedule = build_schedule(graph, **kwargs)
    algorithm = autocvi.cvi(schedule)
    setup = time.perf_counter() - t0

    t0 = time.perf_counter()
    init = jax.jit(algorithm.init).lower(rng_key).compile()
    state = init(rng_key)
    step = jax.jit(algorithm.step).lower(state).compile() if host_sync_loop else None
    compile_time = time.perf_counter() - t0

    all_times, times_host_sync = [], None
    if host_sync_loop:
        states, elbos, times = autocvi_loop(step, state, num_steps, keep_states)
        # The machine may be shared: repeat the (deterministic given the state's key)
        # loop and keep each iteration's fastest time.
        all_times = [times]
        for _ in range(repeats - 1):
            _, elbos_r, times_r = autocvi_loop(step, state, num_steps, keep_states=False)
            if not np.allclose(elbos_r, elbos, equal_nan=True):
                raise RuntimeError("autocvi loop is not reproducible from the same state")
            all_times.append(times_r)
        times_host_sync = np.min(np.stack(all_times), axis=0)

    # autocvi.fit runs its iterations in compiled lax.scan chunks (no host sync
    # per iteration), like SVI.run without a progress bar: time that loop and
    # use it as the per-iteration time. Without the step-at-a-time loop, the
    # timed scan also returns every state (a Gaussian block's state is its
    # sites, O(N); writing it out is negligible next to the step).
    def body(carry, _):
        new, info = algorithm.step(carry)
        return new, ((new, info) if not host_sync_loop else info)

    t0 = time.perf_counter()
    scan_loop = (
        jax.jit(lambda s: jax.lax.scan(body, s, None, length=num_steps)).lower(state).compile()
    )
    scan_compile_time = time.perf_counter() - t0
    scan_times = []
    for _ in range(max(1, repeats)):  # an AOT-compiled call: the first run is timed too
        t = time.perf_counter()
        outputs = jax.block_until_ready(scan_loop(state))[1]
        scan_times.append(time.perf_counter() - t)
    if host_sync_loop:
        infos = outputs
    else:
        stacked_states, infos = outputs
        elbos = np.asarray(infos.elbo)
        states = [state] + [tree_index(stacked_states, i) for i in range(num_steps)]
        states = states if keep_states else []
        compile_time += scan_compile_time
    scan_elbo = np.asarray(infos.elbo)
    times = np.full(num_steps, min(scan_times) / num_steps)
    return {
        "iter_times_host_sync": times_host_sync,
        "scan_times_all_repeats": scan_times,
        "scan_compile_time": scan_compile_time,
        "scan_elbo_matches_step_loop": bool(
            np.allclose(scan_elbo, elbos, rtol=1e-4, atol=1e-3, equal_nan=True)
        ),
        "schedule": schedule,
        "states": states,
        "elbo": elbos,
        "iter_times": times,
        "iter_times_all_repeats": np.stack(all_times) if all_times else None,
        "setup_time": setup,
        "compile_time": compile_time,
        "init": init,
        "step": step,
    }


def autocvi_loop(step, state, num_steps: int, keep_states: bool = True):
    """Continue an autocvi run with a compiled ``step``: (states, elbos, per-iteration times)."""
    states, elbos, times = [state] if keep_states else [], [], []
    for _ in range(num_steps):
        t = time.perf_counter()
        state, info = step(state)
        value = float(info.elbo)
        times.append(time.perf_counter() - t)
        elbos.append(value)
        if keep_states:
            states.append(state)
    return states, np.asarray(elbos), np.asarray(times)


def autocvi_posterior(schedule, state) -> dict:
    """Site -> numpyro Distribution of q for a state of ``schedule`` (as FitResult.posterior)."""
    from autocvi.analysis.layout import site_posterior as _posterior

    return {
        n: schedule.blocks[n].posterior(state.natural[n])
        if n in schedule.blocks
        else _posterior(node.layout, state.natural[n])
        for n, node in schedule.nodes.items()
    }


def fit_summary(result) -> dict:
    """The numbers of an ``autocvi.fit`` FitResult worth recording."""
    return {
        "num_steps": int(result.num_steps),
        "converged": bool(result.converged),
        "wall_time_including_compile": float(result.wall_time),
        "final_elbo_engine": float(result.elbo[-1]),
        "elbo_trace_engine": [float(v) for v in result.elbo],
    }


# ----------------------------------------------------------------------- SVI
def run_svi(
    svi,
    data,
    num_steps: int,
    rng_key=0,
    *,
    record_params: bool = True,
    repeats: int = 3,
    check_run: bool = True,
) -> dict:
    """Time ``SVI.run(progress_bar=False)``'s loop (a ``lax.scan`` of ``svi.update``).

    The scan is the same computation as ``svi.run`` without a progress bar; it
    is compiled ahead of time (compile time reported) and then executed
    ``repeats`` times (loop time: the fastest repeat; all are recorded). With
    ``record_params`` a second, untimed scan returns the guide parameters after every step for posterior evaluation. With
    ``check_run``, ``svi.run`` itself is also called once and its losses
    checked to be identical.
    """
    if isinstance(rng_key, int):
        rng_key = jax.random.PRNGKey(rng_key)
    t0 = time.perf_counter()
    state0 = svi.init(rng_key, **data)
    jax.block_until_ready(state0)
    setup = time.perf_counter() - t0

    def body(state, _):
        state, loss = svi.update(state, **data)
        return state, loss

    def loop(state):
        return jax.lax.scan(body, state, None, length=num_steps)

    t0 = time.perf_counter()
    compiled = jax.jit(loop).lower(state0).compile()
    compile_time = time.perf_counter() - t0
    loop_times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        final, losses = compiled(state0)
        jax.block_until_ready(losses)
        loop_times.append(time.perf_counter() - t0)
    loop_time = min(loop_times)  # the machine may be shared: keep the fastest repeat

    svi_run_time = same = None
    if check_run:  # svi.run itself: same losses as the timed scan
        t0 = time.perf_counter()
        run = svi.run(rng_key, num_steps, progress_bar=False, **data)
        jax.block_until_ready(run.losses)
        svi_run_time = time.perf_counter() - t0
        same = bool(np.allclose(np.asarray(run.losses), np.asarray(losses), rtol=1e-5, atol=1e-3))

    out = {
        "losses": np.asarray(losses),
        "final_params": svi.get_params(final),
        "setup_time": setup,
        "compile_time": compile_time,
        "loop_time": loop_time,
        "loop_times_all_repeats": loop_times,
        "svi_run_time_including_compile": svi_run_time,
        "svi_run_losses_match": same,
    }
    if record_params:
        out["params_at"] = _svi_checkpoints(svi, data, state0, num_steps)
    return out


def _svi_checkpoints(svi, data, state0, num_steps: int, every: int = 200):
    """``params_at(t)``: the guide's parameters after ``t`` SVI steps (t >= 1).

    Keeps the SVI state every ``every`` steps (a whole trace of a D x D
    guide would not fit in memory for GPs) and replays the remaining steps
    from the last checkpoint; SVI is deterministic given its state, so this
    is the same trajectory as the timed run.
    """

    def advance(state, n):
        return jax.lax.fori_loop(0, n, lambda _, st: svi.update(st, **data)[0], state)

    num_ckpt = num_steps // every

    def body(state, _):
        state = advance(state, every)
        return state, state

    _, ckpts = jax.jit(lambda s: jax.lax.scan(body, s, None, length=num_ckpt))(state0)
    advance_jit = jax.jit(advance)

    def params_at(t: int):
        k = min((t // every), num_ckpt)
        start = state0 if k == 0 else tree_index(ckpts, k - 1)
        state = advance_jit(start, jnp.asarray(t - k * every, jnp.int32))
        return svi.get_params(state)

    return params_at


def tree_index(tree, i):
    return jax.tree_util.tree_map(lambda x: x[i], tree)


def log_grid(n: int, num: int = 100, dense: int = 20) -> list[int]:
    """Iterations 1..dense and ``num`` log-spaced points up to ``n`` (1-based, sorted)."""
    pts = set(range(1, min(dense, n) + 1))
    pts |= {int(round(x)) for x in np.geomspace(1, n, num)}
    pts.add(n)
    return sorted(p for p in pts if 1 <= p <= n)


def first_hit(iters, values, target):
    """First iteration whose value is >= target (None if never)."""
    for it, v in zip(iters, values):
        if np.isfinite(v) and v >= target:
            return int(it)
    return None


def refine_first_hit(evaluate: Callable[[int], float], iters, values, target):
    """First iteration >= target, refined between the grid points around the first grid hit.

    ``iters``/``values`` are a grid (sorted). Between the last grid point below
    and the first grid hit, at most 40 evenly spaced iterations are evaluated,
    then every iteration before the first of those that hits (so the answer is
    exact when the gap is at most 40 steps, and within gap/40 steps otherwise).
    Returns the iteration and a dict of the extra evaluations.
    """
    hit = first_hit(iters, values, target)
    if hit is None:
        return None, {}
    k = list(iters).index(hit)
    lo = iters[k - 1] if k > 0 else 0
    extra = {}
    stride = max(1, (hit - lo) // 40)

    def scan(points):
        for it in points:
            extra[it] = evaluate(it)
            if np.isfinite(extra[it]) and extra[it] >= target:
                return it
        return None

    coarse = scan(range(lo + stride, hit, stride)) if stride > 1 else None
    if stride > 1:
        upper = coarse if coarse is not None else hit
        fine = scan(range(max(lo + 1, upper - stride + 1), upper))
        return (fine or upper), extra
    found = scan(range(lo + 1, hit))
    return (found or hit), extra


# -------------------------------------------------------------------- output
def to_jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (np.ndarray, jax.Array)):
        return to_jsonable(np.asarray(obj).tolist())
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if np.isfinite(v) else None
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    return obj


def write_results(name: str, payload: dict, markdown: str, plot: Callable | None = None) -> list:
    """Write ``results/<name>.json``, ``.md`` and, if matplotlib imports, ``.png``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    paths = []
    p = RESULTS / f"{name}.json"
    p.write_text(json.dumps(to_jsonable(payload), indent=1) + "\n")
    paths.append(p)
    p = RESULTS / f"{name}.md"
    p.write_text(markdown.rstrip() + "\n")
    paths.append(p)
    if plot is not None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib not importable: no plot written (pip install matplotlib)")
        else:
            fig = plot(plt)
            p = RESULTS / f"{name}.png"
            fig.savefig(p, dpi=120, bbox_inches="tight")
            plt.close(fig)
            paths.append(p)
    return paths


def md_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


def timing_cells(m: dict) -> tuple[str, str, str]:
    """ "ms / iter" (with the host-synced per-step time in brackets when recorded),
    compile s and setup s of one method's record."""
    per_iter = fmt(m["per_iter_time"] * 1e3, ".3g")
    if "per_iter_time_host_sync" in m:
        per_iter += f" ({m['per_iter_time_host_sync'] * 1e3:.3g})"
    return per_iter, fmt(m["compile_time"], ".2f"), fmt(m["setup_time"], ".2f")


def fmt(x, spec=".3g", none="—"):
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return none
    return format(x, spec)


def ratio(peer, ours, spec=".1f", peer_name="peer", our_name="autocvi"):
    """``peer / ours`` formatted (how many times more the peer needs), or what is missing."""
    if peer is None and ours is None:
        return "neither reaches"
    if ours is None:
        return f"{our_name} does not reach"
    if peer is None:
        return f"{peer_name} does not reach"
    if ours == 0:
        return "inf"
    return format(peer / ours, spec) + "x"
