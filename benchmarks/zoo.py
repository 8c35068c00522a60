"""The model zoo: ``autocvi.fit`` with its defaults on every model of ``tests/zoo/models.py``,
against the NUTS and SVI references in ``tests/zoo/references/<name>.json``.

Per model (each in its own process, with a time limit): status (fitted, converged, or the
exception a user gets), max and mean |z| of q's means against NUTS (z = (mean_q - mean_nuts) /
sd_nuts per element of every latent site), the median sd ratio sd_q / sd_nuts, autocvi's
final ELBO against the reference's ``svi.elbo_best``, iterations, cold seconds (the first fit
in the process: tracing and compilation included) and warm seconds (a second fit), and the
seconds SVI (AutoMultivariateNormal + Adam at the reference's best learning rate, one fused
``lax.scan``) needs to reach autocvi's ELBO (500-particle ELBO at 50 checkpoints).

    python -m benchmarks zoo [--quick] [--jobs=2]  # every model; results/zoo.*, docs/zoo.md
    python -m benchmarks zoo:eight_schools         # one model
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import time
import traceback
import warnings

import numpy as np

from . import driver as D

ZOO = D.ROOT / "tests" / "zoo"
TIMEOUT = 420  # seconds per model (--quick: 240); a loaded shared machine is slow
BARS = "ELBO >= svi elbo_best - 0.5 nat; max|z| <= max(0.1, SVI's max|z| + 0.05); median sd ratio in [0.9, 1.1]"


def _zoo(module):
    """``tests/zoo/<module>.py`` (the models, their scoring and expectations)."""
    import importlib

    if str(ZOO.parent) not in sys.path:
        sys.path.insert(0, str(ZOO.parent))
    return importlib.import_module(f"zoo.{module}")


def models():
    return _zoo("models").MODELS


def _z(name, draws: dict, ref: dict, data: dict):
    """(max |z|, mean |z|, median sd ratio) of 4,000 draws against NUTS, with label
    switching undone as for NUTS (``tests/zoo/scoring.py``, as the slow tests score)."""
    draws = {k: np.asarray(v) for k, v in draws.items()}
    z, ratio = _zoo("scoring").scores(name, draws, ref, only_missing=data.get("mask"))
    if not z.size:
        return None, None, None
    return float(np.nanmax(z)), float(np.nanmean(z)), float(np.nanmedian(ratio))


def svi_to_reach(name, model, data, ref, target, quick):
    """SVI (AutoMVN + Adam at the reference's best rate): seconds to reach ``target``."""
    import jax
    from numpyro.infer import Trace_ELBO
    from numpyro.infer.autoguide import AutoMultivariateNormal
    from numpyro.optim import Adam

    svi_ref = ref["svi"]
    if name in _zoo("models").SVI_MODELS:  # the model as written has no bounded SVI ELBO
        model, data = _zoo("models").SVI_MODELS[name](data), {}
    steps = int(ref["settings"]["svi"]["steps"]) // (5 if quick else 1)
    m = D.SVIMethod("svi", AutoMultivariateNormal, Adam(svi_ref["best_lr"]))
    checkpoints = [int(round(x)) for x in np.linspace(0, steps, 51)[1:]]
    r = D.run(m, model, data, steps, keep=checkpoints, repeats=1)
    loss = Trace_ELBO(num_particles=500, vectorize_particles=True)
    elbo = jax.jit(lambda p, k: -loss.loss(k, p, model, m.guide, **data))
    key = jax.random.PRNGKey(2)
    values = [float(elbo(m.svi.get_params(r["_kept"][t]), key)) for t in checkpoints]
    hit = D.first_hit(checkpoints, values, target) if target is not None else None
    # The cold-start target: within 1 nat of the better of the two optima.
    best = max(v for v in (target, svi_ref.get("elbo_best"), *values) if v is not None)
    near = D.first_hit(checkpoints, values, best - 1.0)
    draws = m.guide.sample_posterior(
        jax.random.PRNGKey(3), m.svi.get_params(r["_kept"][steps]), sample_shape=(4000,)
    )
    return {
        "learning_rate": svi_ref["best_lr"],
        "steps": steps,
        "per_step_seconds": r["per_iter_time"],
        "compile_seconds": r["compile_time"],
        "elbo_at_checkpoints": dict(zip(checkpoints, values)),
        "reached_at_step": hit,
        "seconds_to_reach": None if hit is None else hit * r["per_iter_time"],
        "one_nat_target": best - 1.0,
        "seconds_to_one_nat": None if near is None else near * r["per_iter_time"],
        "max_abs_z": _z(name, draws, ref, data)[0],
    }


def svi_cold(name, quick=False) -> dict:
    """What an SVI user waits for before the first step, in a fresh process of its own as
    autocvi's cold fit is (``python -m benchmarks.zoo <name> --svi-cold``): the guide and
    ``svi.init`` (tracing the model, the init strategy's search, their compilations) and
    the compilation of the loop :func:`svi_to_reach` runs. In :func:`run_one`'s process
    SVI comes after autocvi has warmed JAX's caches, so its setup there is not a cold one."""
    from numpyro.infer.autoguide import AutoMultivariateNormal
    from numpyro.optim import Adam

    ref = json.loads((ZOO / "references" / f"{name}.json").read_text())
    model, data = models()[name]()
    if name in _zoo("models").SVI_MODELS:
        model, data = _zoo("models").SVI_MODELS[name](data), {}
    steps = int(ref["settings"]["svi"]["steps"]) // (5 if quick else 1)
    m = D.SVIMethod("svi", AutoMultivariateNormal, Adam(ref["svi"]["best_lr"]))
    (setup,), state = D.timed(lambda: m.setup(model, data), 1)
    return {"cold_setup_seconds": setup, "cold_compile_seconds": m.compile(state, steps)}


def new_values(data: dict, seed: int = 1) -> dict:
    """Data of the same shapes, dtypes and supports with other values: the rows of every
    array whose leading axis is the longest, in one random order (other arguments kept)."""
    rows = {k: v.shape[0] for k, v in data.items() if isinstance(v, np.ndarray) and v.ndim}
    n = max(rows.values(), default=0)
    order = np.random.RandomState(seed).permutation(n)
    return {k: v[order] if rows.get(k) == n else v for k, v in data.items()}


def cvi_refit(model, data) -> dict:
    """The issue's warm refit: ``autocvi.CVI(model).run`` on data of the same shapes with
    new values, after a first run (the CVI object keeps its trace, plan and programs; the
    data are inputs of its compiled functions). Timed twice: the second run (its loop at
    the short compilation's code), and once the loop's program has moved to full
    optimisation (refits on other new values until it has, at most 60 s), as SVI's
    compiled loop is."""
    import jax

    import autocvi

    def refit(seed):
        t = time.perf_counter()
        r = cvi.run(jax.random.PRNGKey(0), 500, **new_values(data, seed))
        jax.block_until_ready(r.state)
        return time.perf_counter() - t, r.num_steps

    fast = autocvi.program_cache_info()["fast"]
    cvi = autocvi.CVI(model)
    jax.block_until_ready(cvi.run(jax.random.PRNGKey(0), 500, **data).state)
    seconds, steps = refit(1)
    out = {"cvi_new_data_seconds": seconds, "cvi_new_data_steps": steps}
    seeds = iter(range(2, 10**6))
    if D.optimised(lambda: refit(next(seeds)), fast, seconds=60.0):
        out["cvi_new_data_optimised_seconds"] = refit(1)[0]
    return out


def run_one(name, quick=False) -> dict:
    """One model, in this process (``python -m benchmarks.zoo <name>`` runs it in a child)."""
    import jax  # float32: the precision users get by default (and the slow tests use)

    import autocvi

    out = {"model": name}
    path = ZOO / "references" / f"{name}.json"
    if not path.exists():
        return {**out, "status": "no reference"}
    ref = json.loads(path.read_text())
    model, data = models()[name]()
    try:
        # What a user waits for: the first fit in a fresh process; then a second one.
        # ``wall_time`` is the loop (its first chunk compiles); the rest of a call is
        # trace + plan + the compiles of init and the final ELBO estimate.
        t = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", autocvi.FitWarning)
            res = autocvi.fit(model, data, progress_bar=False)
        out["cold_seconds"] = time.perf_counter() - t
        out["fit_warnings"] = [
            str(w.message) for w in caught if issubclass(w.category, autocvi.FitWarning)
        ]
        out["cold_loop_seconds"] = float(res.wall_time)
        t = time.perf_counter()
        warm = autocvi.fit(model, data, progress_bar=False)
        out["warm_seconds"] = time.perf_counter() - t
        out["warm_loop_seconds"] = float(warm.wall_time)
        t = time.perf_counter()
        autocvi.plan(model, data)
        out["warm_trace_plan_seconds"] = time.perf_counter() - t
        out.update(cvi_refit(model, data))
    except Exception as e:  # noqa: BLE001 - what a user gets
        return {
            **out,
            "status": "raised",
            "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
        }
    draws = res.sample(jax.random.PRNGKey(1), 4000)
    out.update(status="fitted", converged=bool(res.converged), iterations=int(res.num_steps))
    sched = res.schedule
    out["kind"] = (
        "VMP"
        if sched.all_exact
        else "Gaussian block"
        if sched.blocks
        else "deterministic"
        if sched.deterministic
        else "Monte Carlo"
    )
    out["max_abs_z"], out["mean_abs_z"], out["median_sd_ratio"] = _z(name, draws, ref, data)
    out["elbo"] = float(res.elbo_final)
    check = res.diagnostics.importance
    if check is not None:
        out["importance"] = {"pareto_k": check.pareto_k, "ess": check.ess}
    best = (ref.get("svi") or {}).get("elbo_best")
    out["svi_elbo_best"] = best
    out["elbo_minus_svi_best"] = None if best is None else out["elbo"] - best
    if ref.get("svi"):
        try:
            out["svi"] = svi_to_reach(name, model, data, ref, out["elbo"], quick)
        except Exception as e:  # noqa: BLE001
            out["svi"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def bars(r) -> dict:
    """The bars that apply. ELBO: SVI's best - 0.5 nat wherever SVI ran on the same
    objective. z and sd: the issue's bars where q's family can represent the posterior,
    else the model's own bars from ``tests/zoo/expectations.py`` (which say why)."""
    if r.get("status") != "fitted":
        return {}
    own = _zoo("expectations").OUT_OF_REACH.get(r["model"])
    svi_z = (r.get("svi") or {}).get("max_abs_z")
    z_bar = max(0.1, (svi_z if svi_z is not None else 0.0) + 0.05) if own is None else own[0]
    sd_bar = (0.9, 1.1) if own is None else own[1]
    out = {}
    if r.get("elbo_minus_svi_best") is not None:
        out["elbo"] = r["elbo_minus_svi_best"] >= -0.5
    if r.get("max_abs_z") is not None and z_bar is not None:
        out["z"] = r["max_abs_z"] <= z_bar
    if r.get("median_sd_ratio") is not None and sd_bar is not None:
        out["sd"] = sd_bar[0] <= r["median_sd_ratio"] <= sd_bar[1]
    return out


def _family(label, r):
    """Whether q's family can represent the posterior, else why not (the expectations)."""
    e = _zoo("expectations")
    why = (e.OUT_OF_REACH.get(label) or (None,) * 4)[-1] or e.LOUD.get(label)
    return f"no: {why}" if why else "yes"


def _last_record(cmd, timeout) -> dict:
    """The JSON record a child prints as its last line, or what went wrong."""
    try:
        p = subprocess.run(cmd, cwd=D.ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"no result within {timeout} s"}
    line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{")), None)
    return json.loads(line) if line else {"status": "crashed", "error": p.stderr.strip()[-300:]}


def _child(name, quick, timeout, core):
    """One model in a fresh process (pinned to ``core`` when given), then SVI's cold setup
    in another (:func:`svi_cold`): its record."""
    cmd = [sys.executable, "-m", "benchmarks.zoo", name] + (["--quick"] if quick else [])
    if core is not None:
        cmd = ["taskset", "-c", str(core)] + cmd
    t = time.perf_counter()
    r = {"model": name, **_last_record(cmd, timeout)}
    r["process_seconds"] = time.perf_counter() - t
    if "error" not in r.get("svi", {"error": None}):
        r["svi"].update(_last_record(cmd + ["--svi-cold"], timeout))
    r["bars"] = bars(r)
    print(f"[zoo] {name}: {r.get('status')} {r.get('error', '')}", flush=True)
    return r


def run(names=None, quick=False, jobs=1):
    """``jobs`` > 1 runs that many children at once, child ``k`` pinned to core ``k``
    (each model still has a core to itself; ``--jobs 2`` on a 2-core machine)."""
    from concurrent.futures import ThreadPoolExecutor

    names = names or list(models())
    timeout = 240 if quick else TIMEOUT
    cores = list(range(jobs)) if jobs > 1 else [None]
    free = queue.Queue()
    for c in cores:
        free.put(c)

    def one(name):
        core = free.get()
        try:
            return _child(name, quick, timeout, core)
        finally:
            free.put(core)

    with ThreadPoolExecutor(max_workers=len(cores)) as pool:
        results = dict(zip(names, pool.map(one, names)))
    payload = {
        "benchmark": "zoo",
        "environment": D.environment(),
        "quick": quick,
        "timeout_seconds": timeout,
        "jobs": jobs,
    }
    payload.update(bars=BARS, models=results, full=names == list(models()))
    print(write_pages(payload))
    return payload


def write_pages(payload) -> str:
    """``results/zoo.*`` and ``results/cold_start.*``; ``docs/zoo.md`` from a full run."""
    md = markdown(payload)
    D.write("zoo", payload, md)
    D.write(
        "cold_start",
        payload,
        cold_start_markdown(payload),
        panels=lambda plt: cold_start_plot(plt, payload),
    )
    if payload.get("full", True):  # the docs page only from a full run
        (D.ROOT / "docs" / "zoo.md").write_text(md)
        write_plot(payload, D.ROOT / "docs" / "zoo.png")
    return md


def _status(label, r):
    s = r["status"]
    if s == "fitted":
        return "converged" if r["converged"] else "fitted, not converged"
    return f"{s}: {r['error']}" if r.get("error") else s


def _svi(key):
    return lambda label, r: (r.get("svi") or {}).get(key)


def _reach(label, r):
    svi = r.get("svi") or {}
    if "error" in svi:
        return f"error: {svi['error']}"
    if not svi:
        return "—"
    return (
        "not reached"
        if svi["seconds_to_reach"] is None
        else f"{svi['seconds_to_reach']:.3g} (step {svi['reached_at_step']})"
    )


def _importance(label, r):
    check = r.get("importance")
    if check is None:
        return "—"
    return f"{check['pareto_k']:.2f} / {100 * check['ess']:.1f}%"


def _warned(label, r):
    """Which after-fit checks warned (the coupling check, the importance check)."""
    messages = r.get("fit_warnings") or []
    kinds = [
        kind
        for kind, text in (
            ("coupling", "couples them"),
            ("importance", "misses part"),
            ("too narrow", "too narrow"),
        )
        if any(text in m for m in messages)
    ]
    return ", ".join(kinds) or "—"


def _speedup(r):
    svi = r.get("svi") or {}
    if svi.get("seconds_to_reach") is None or not r.get("warm_seconds"):
        return None
    return svi["seconds_to_reach"] / r["warm_seconds"]


COLUMNS = [
    ("model", lambda k, r: f"`{k}`", None),
    ("status", _status, None),
    ("max abs z", "max_abs_z", ".3f"),
    ("mean abs z", "mean_abs_z", ".3f"),
    ("median sd ratio", "median_sd_ratio", ".3f"),
    ("ELBO", "elbo", ".3f"),
    ("ELBO - svi elbo_best (nats)", "elbo_minus_svi_best", "+.3f"),
    ("iterations", "iterations", "d"),
    ("cold s", "cold_seconds", ".2f"),
    ("warm s", "warm_seconds", ".2f"),
    ("SVI s to autocvi's ELBO", _reach, None),
    ("SVI max abs z", _svi("max_abs_z"), ".3f"),
    ("speed-up (SVI s / warm s)", lambda k, r: _speedup(r), ".3g"),
    ("importance: Pareto-k / ESS", _importance, None),
    ("after-fit warnings", _warned, None),
    ("q's family represents the posterior", _family, None),
    (
        "bars met",
        lambda k, r: ", ".join(f"{b} {'yes' if v else 'NO'}" for b, v in r["bars"].items()) or "—",
        None,
    ),
]


def _concurrency(p) -> str:
    """How many models ran at once: with both cores busy, cold and warm seconds read
    about a third higher than with one model at a time (shared caches and memory)."""
    jobs = p.get("jobs", 1)
    if jobs == 1:
        return "one model at a time"
    return (
        f"{jobs} models at a time, each pinned to its own core (`--jobs={jobs}`: "
        "seconds read about a third higher than one model at a time, e.g. "
        "`iris_mixture` cold 13.7 s against 10.5 s in the one-at-a-time run of "
        "2026-11-26 14:00)"
    )


def markdown(p) -> str:
    # The *_marginal twins are NUTS's models for those with discrete latents, not zoo
    # models of their own: listed, not counted.
    twins = [k for k, r in p["models"].items() if r.get("status") == "no reference"]
    res = {k: r for k, r in p["models"].items() if k not in twins}
    fitted = [r for r in res.values() if r["bars"]]
    all_met = [k for k, r in res.items() if r["bars"] and all(r["bars"].values())]
    counts = {b: sum(1 for r in fitted if r["bars"].get(b)) for b in ("elbo", "z", "sd")}
    missed = [k for k in res if k not in all_met]
    return f"""# autocvi on the model zoo

{D.env_line(p["environment"], "zoo" + (" --quick" if p["quick"] else ""))}

Every model of `tests/zoo/models.py` with a reference in `tests/zoo/references/` (models without
one are listed as "no reference"), fitted by `autocvi.fit(model, **data)` with its defaults,
each in its own process, {_concurrency(p)} (time limit {p["timeout_seconds"]} s: a hang is a "timeout"; an
exception is recorded as the user sees it). z = (mean_q - mean_NUTS) / sd_NUTS per element of
the latent sites; sd ratio = sd_q / sd_NUTS. ELBO: `FitResult.elbo_final` against the
reference's best SVI/Laplace ELBO (`svi.elbo_best`). Cold: the first `fit` in the process
(tracing and compilation included); warm: a second `fit` of the same model. SVI:
AutoMultivariateNormal + Adam at the reference's best learning rate for its step count, one
fused `lax.scan` (compile excluded), a 500-particle ELBO at 50 checkpoints; "SVI s to
autocvi's ELBO" is the first checkpoint at or above autocvi's ELBO. Speed-up = SVI's seconds
to autocvi's ELBO / autocvi's warm seconds. Importance: `result.diagnostics.importance`, the
Pareto-k and effective sample size of q's importance ratios over 4,000 draws; after-fit
warnings: which of `fit`'s checks of q warned (the coupling check; the importance check:
k > 0.7 and ESS < 5%, or "too narrow": q's sd below 0.87 of the importance-weighted sd at
some coordinate; `docs/limitations.md`).

**Summary**: {len(all_met)} of {len(res)} models ({100 * len(all_met) / max(len(res), 1):.0f}%) meet
every bar that applies ({BARS}, where q's family can represent the posterior; where it
cannot, the table says why and the model's own bars from `tests/zoo/expectations.py` apply,
as in the slow tests); of the {len(fitted)} fitted with a
reference: ELBO bar {counts["elbo"]}, z bar {counts["z"]}, sd bar {counts["sd"]}.
Not met: {", ".join(f"`{k}`" for k in missed) or "none"}. Not counted (NUTS's
marginalised twins of models with discrete latents, no reference of their own):
{", ".join(f"`{k}`" for k in twins) or "none"}.

{D.table(COLUMNS, res)}

![accuracy against speed-up](zoo.png)
"""


def _svi_cold(r):
    """SVI's cold wait to 1 nat: setup and compilation in a fresh process, then the loop."""
    svi = r.get("svi") or {}
    parts = ("cold_setup_seconds", "cold_compile_seconds", "seconds_to_one_nat")
    return None if any(svi.get(k) is None for k in parts) else sum(svi[k] for k in parts)


def _cold_ratio(r):
    """autocvi's cold seconds / SVI's (setup + compile + loop to 1 nat of the better
    optimum, each in a fresh process)."""
    svi = _svi_cold(r)
    return None if svi is None or not r.get("cold_seconds") else r["cold_seconds"] / svi


def _warm_ratio(r):
    """autocvi's warm seconds / SVI's compiled loop to 1 nat."""
    svi = r.get("svi") or {}
    if not svi.get("seconds_to_one_nat") or not r.get("warm_seconds"):
        return None
    return r["warm_seconds"] / svi["seconds_to_one_nat"]


def _cvi_ratio(r):
    """Warm ``CVI.run`` on new data of the same shapes / SVI's compiled loop to 1 nat."""
    svi = r.get("svi") or {}
    if not svi.get("seconds_to_one_nat") or not r.get("cvi_new_data_seconds"):
        return None
    return r["cvi_new_data_seconds"] / svi["seconds_to_one_nat"]


def _cvi_optimised_ratio(r):
    """The same, once the loop's program is fully optimised (as SVI's is)."""
    svi = r.get("svi") or {}
    if not svi.get("seconds_to_one_nat") or not r.get("cvi_new_data_optimised_seconds"):
        return None
    return r["cvi_new_data_optimised_seconds"] / svi["seconds_to_one_nat"]


def _reached(label, r):
    svi = r.get("svi") or {}
    if "one_nat_target" not in svi or r.get("elbo") is None:
        return "—"
    return "yes" if r["elbo"] >= svi["one_nat_target"] else "NO"


COLD_COLUMNS = [
    ("model", lambda k, r: f"`{k}`", None),
    ("schedule", "kind", None),
    ("autocvi cold s", "cold_seconds", ".2f"),
    ("of which loop (compile + iterations)", "cold_loop_seconds", ".2f"),
    ("warm s", "warm_seconds", ".2f"),
    ("warm trace + plan s", "warm_trace_plan_seconds", ".3f"),
    ("warm loop s", "warm_loop_seconds", ".3f"),
    ("autocvi within 1 nat", _reached, None),
    ("SVI cold setup s", _svi("cold_setup_seconds"), ".2f"),
    ("SVI cold compile s", _svi("cold_compile_seconds"), ".2f"),
    ("SVI loop s to 1 nat", _svi("seconds_to_one_nat"), ".3g"),
    ("cold / SVI (setup + compile + loop)", lambda k, r: _cold_ratio(r), ".3g"),
    ("warm / SVI loop", lambda k, r: _warm_ratio(r), ".3g"),
    ("warm `CVI.run`, new data, s", "cvi_new_data_seconds", ".3f"),
    ("warm `CVI.run` / SVI loop", lambda k, r: _cvi_ratio(r), ".3g"),
    ("same, loop optimised, s", "cvi_new_data_optimised_seconds", ".3f"),
    ("optimised `CVI.run` / SVI loop", lambda k, r: _cvi_optimised_ratio(r), ".3g"),
]


def cold_start_markdown(p) -> str:
    """Issue 14's table: what the user waits for, from the zoo's per-process runs."""
    res = {k: r for k, r in p["models"].items() if r.get("status") != "no reference"}
    cold = [x for x in (_cold_ratio(r) for r in res.values()) if x is not None]
    warm = {k: _warm_ratio(r) for k, r in res.items() if r.get("kind") in ("VMP", "Gaussian block")}
    faster = [k for k, x in warm.items() if x is not None and x < 1.0]
    runs = {k: _cvi_ratio(r) for k, r in res.items() if r.get("kind") in ("VMP", "Gaussian block")}
    runs_faster = [k for k, x in runs.items() if x is not None and x < 1.0]
    tiered = {
        k: _cvi_optimised_ratio(r)
        for k, r in res.items()
        if r.get("kind") in ("VMP", "Gaussian block")
    }
    tiered_faster = [k for k, x in tiered.items() if x is not None and x < 1.0]
    compared = [k for k, x in runs.items() if x is not None]
    # The two named models: trace + plan (a second autocvi.plan) below 0.3 s.
    planned = ", ".join(
        f"`{k}` {res[k]['warm_trace_plan_seconds']:.3f} s"
        for k in ("conjugate_hierarchy", "gp_classification_ionosphere")
        if (res.get(k) or {}).get("warm_trace_plan_seconds") is not None
    )
    median = f"{np.median(cold):.3g}" if cold else "—"
    worst = f"{max(cold):.3g}" if cold else "—"
    return f"""# Cold start: what a user waits for, autocvi against NumPyro SVI

{D.env_line(p["environment"], "cold_start" + (" --quick" if p["quick"] else ""))}

The zoo's models (`tests/zoo/models.py`), each in a fresh process pinned to one core
({_concurrency(p)}), in float32. autocvi cold: the first `autocvi.fit(model, data)` of the process (trace, plan,
compilation and the loop); "of which loop" is `FitResult.wall_time` (its first chunk
compiles); warm: a second `fit` of the same model and data shapes (compiled programs reused,
docs/compilation.md); warm trace + plan: `autocvi.plan` once more. SVI: AutoMultivariateNormal
+ Adam at the reference's best learning rate, compiled ahead of time and run as one fused
`lax.scan`. SVI's cold wait is timed as autocvi's, in a fresh process of its own (pinned to
the same core): "SVI cold setup" builds the guide and runs `svi.init` (tracing the model and
the init strategy's search, with their compilations), "SVI cold compile" compiles the fused
loop; in the autocvi process SVI would start with JAX's caches warmed by autocvi. "Loop s to
1 nat" is the first of 50 checkpoints whose 500-particle
ELBO is within 1 nat of the better optimum (autocvi's ELBO, SVI's, or the reference's
`svi.elbo_best`). Ratios below 1 favour autocvi; "autocvi within 1 nat" says whether autocvi's
own ELBO reached that target. Warm `CVI.run`, new data: the issue's warm refit with new data
of the same shapes, `autocvi.CVI(model).run(key, 500, **data)` once and then timed on the
same arrays with their rows in another order (`new_values`: the rows of every array whose
leading axis is the longest, permuted together), which keeps shapes and supports; the CVI
object keeps its trace, plan and compiled programs, its data are inputs of those programs
(a Gaussian block reads its predictor matrices from them in one compiled program), and `run`
skips `fit`'s after-fit checks. It retraces only for an argument a latent's prior reads
(except a Gaussian block's own whitened prior: a GP's kernel inputs are read again with its
predictors) or a model that needs concrete data (an `obs_mask`). The second run's loop is
still the short compilation's code (docs/compilation.md); "same, loop optimised" times it
once the loop's program has moved to full optimisation (after refits on other row orders),
as SVI's compiled loop is.

## Headline: cold and warm time to within 1 nat, against SVI

**Summary**: cold time / SVI's cold time (setup + compile + loop to 1 nat): median {median}, worst
{worst} over {len(cold)} models where SVI reached the target. Warm refit faster than SVI's
compiled loop on {len(faster)} of {len(warm)} VMP and Gaussian-block models. Warm `CVI.run` on
new data, of the {len(compared)} of them where SVI reached 1 nat: faster on {len(runs_faster)}
({", ".join(f"`{k}`" for k in runs_faster) or "none"}) at its second run, on
{len(tiered_faster)} ({", ".join(f"`{k}`" for k in tiered_faster) or "none"}) once its loop is
optimised. Trace + plan (warm, the issue's bar 0.3 s): {planned or "—"}. Run with
{_concurrency(p)}.

{D.table(COLD_COLUMNS, res)}

![cold and warm time against SVI](cold_start.png)
"""


def cold_start_plot(plt, p):
    fig, ax = plt.subplots(figsize=(7, 5))
    for name, r in p["models"].items():
        x, y = _cold_ratio(r), _warm_ratio(r)
        if x is None or y is None:
            continue
        ax.scatter(x, y, color="C0")
        ax.annotate(name, (x, y), fontsize=7)
    ax.set(xscale="log", yscale="log", xlabel="cold: autocvi s / SVI (setup + compile + loop) s")
    ax.set_ylabel("warm: autocvi s / SVI loop s")
    ax.axhline(1.0, color="k", lw=0.6, ls=":")
    ax.axvline(1.0, color="k", lw=0.6, ls=":")
    return fig


def write_plot(p, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 5))
    for name, r in p["models"].items():
        x, y = _speedup(r), r.get("max_abs_z")
        if y is None:
            continue
        x = x if x is not None else 1e-2  # SVI never reached it: plotted at the left edge
        ax.scatter(x, y, color="C0" if _speedup(r) is not None else "C3")
        ax.annotate(name, (x, y), fontsize=7)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="speed-up: SVI s to autocvi's ELBO / autocvi warm s (red: SVI never reaches)",
    )
    ax.set_ylabel("max |z| of autocvi's means against NUTS")
    ax.axhline(0.1, color="k", lw=0.6, ls=":")
    ax.axvline(1.0, color="k", lw=0.6, ls=":")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def render():
    """Rewrite the pages from ``results/zoo.json`` (no fits): ``python -m benchmarks zoo
    --render`` after a change to the tables' text."""
    payload = json.loads((D.RESULTS / "zoo.json").read_text())
    for r in payload["models"].values():
        r["bars"] = bars(r)
    write_pages(payload)


def main(argv=None):
    argv = argv or []
    if "--render" in argv:
        return render()
    jobs = next((int(a.split("=")[1]) for a in argv if a.startswith("--jobs=")), 1)
    run([a for a in argv if not a.startswith("-")] or None, quick="--quick" in argv, jobs=jobs)


if __name__ == "__main__":  # child process: one model, its record as the last line of stdout
    try:
        one = svi_cold if "--svi-cold" in sys.argv else run_one
        record = one(sys.argv[1], "--quick" in sys.argv)
    except Exception as e:  # noqa: BLE001
        record = {
            "model": sys.argv[1],
            "status": "crashed",
            "error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc(),
        }
    print(json.dumps(D.to_jsonable(record)))
