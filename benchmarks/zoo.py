"""The model zoo: ``autocvi.fit`` with its defaults on every model of ``tests/zoo/models.py``,
against the NUTS and SVI references in ``tests/zoo/references/<name>.json``.

Per model (each in its own process, with a time limit): status (fitted, converged, or the
exception a user gets), max and mean |z| of q's means against NUTS (z = (mean_q - mean_nuts) /
sd_nuts per element of every latent site), the median sd ratio sd_q / sd_nuts, autocvi's
final ELBO against the reference's ``svi.elbo_best``, iterations, cold seconds (the first fit
in the process: tracing and compilation included) and warm seconds (a second fit), and the
seconds SVI (AutoMultivariateNormal + Adam at the reference's best learning rate, one fused
``lax.scan``) needs to reach autocvi's ELBO (2,000-particle ELBO at 50 checkpoints).

    python -m benchmarks zoo [--quick]          # every model; writes results/zoo.* and docs/zoo.md
    python -m benchmarks zoo:eight_schools      # one model
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import traceback

import numpy as np

from . import driver as D

ZOO = D.ROOT / "tests" / "zoo"
TIMEOUT = 420  # seconds per model (--quick: 240); a loaded shared machine is slow
BARS = "ELBO >= svi elbo_best - 0.5 nat; max|z| <= max(0.1, SVI's max|z| + 0.05); median sd ratio in [0.9, 1.1]"


def models():
    sys.path.insert(0, str(ZOO.parent))
    from zoo.models import MODELS

    return MODELS


def _moments(q, draws):
    """Mean and sd of a site's q: the distribution's own, else from draws."""
    try:
        m, v = np.asarray(q.mean, float), np.asarray(q.variance, float)
        if np.all(np.isfinite(m)) and np.all(np.isfinite(v)):
            return m.ravel(), np.sqrt(v).ravel()
    except Exception:  # noqa: BLE001 - no closed form
        pass
    x = np.asarray(draws, float).reshape(draws.shape[0], -1)
    return x.mean(0), x.std(0)


def _z(moments: dict, ref: dict):
    """(max |z|, mean |z|, median sd ratio) over the latent sites both know."""
    z, ratio = [], []
    for name, site in ref["nuts"]["sites"].items():
        if site["kind"] != "latent" or name not in moments:
            continue
        m, s = moments[name]
        rm, rs = (np.asarray(site[k], float) for k in ("mean", "sd"))
        if m.size != rm.size:
            continue
        z.append(np.abs(m - rm) / rs)
        ratio.append(s / rs)
    if not z:
        return None, None, None
    z, ratio = np.concatenate(z), np.concatenate(ratio)
    return float(np.nanmax(z)), float(np.nanmean(z)), float(np.nanmedian(ratio))


def svi_to_reach(model, data, ref, target, quick):
    """SVI (AutoMVN + Adam at the reference's best rate): seconds to reach ``target``."""
    import jax
    from numpyro.infer import Trace_ELBO
    from numpyro.infer.autoguide import AutoMultivariateNormal
    from numpyro.optim import Adam

    svi_ref = ref["svi"]
    steps = int(ref["settings"]["svi"]["steps"]) // (5 if quick else 1)
    m = D.SVIMethod("svi", AutoMultivariateNormal, Adam(svi_ref["best_lr"]))
    checkpoints = [int(round(x)) for x in np.linspace(0, steps, 51)[1:]]
    r = D.run(m, model, data, steps, keep=checkpoints, repeats=1)
    loss = Trace_ELBO(num_particles=2000, vectorize_particles=True)
    elbo = jax.jit(lambda p, k: -loss.loss(k, p, model, m.guide, **data))
    key = jax.random.PRNGKey(2)
    values = [float(elbo(m.params(r.kept[t]), key)) for t in checkpoints]
    hit = D.first_hit(checkpoints, values, target) if target is not None else None
    draws = m.guide.sample_posterior(
        jax.random.PRNGKey(3), m.params(r.kept[steps]), sample_shape=(4000,)
    )
    moments = {k: _moments(None, np.asarray(v)) for k, v in draws.items()}
    return {
        "learning_rate": svi_ref["best_lr"],
        "steps": steps,
        "per_step_seconds": r.per_iter_time,
        "compile_seconds": r.compile_time,
        "elbo_at_checkpoints": dict(zip(checkpoints, values)),
        "reached_at_step": hit,
        "seconds_to_reach": None if hit is None else hit * r.per_iter_time,
        "max_abs_z": _z(moments, ref)[0],
    }


def run_one(name, quick=False) -> dict:
    """One model, in this process (``python -m benchmarks.zoo <name>`` runs it in a child)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import autocvi

    out = {"model": name}
    path = ZOO / "references" / f"{name}.json"
    if not path.exists():
        return {**out, "status": "no reference"}
    ref = json.loads(path.read_text())
    model, data = models()[name]()
    try:
        t = time.perf_counter()
        res = autocvi.fit(model, data, progress_bar=False)
        out["cold_seconds"] = time.perf_counter() - t
        t = time.perf_counter()
        autocvi.fit(model, data, progress_bar=False)
        out["warm_seconds"] = time.perf_counter() - t
    except Exception as e:  # noqa: BLE001 - what a user gets
        return {
            **out,
            "status": "raised",
            "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
        }
    draws = res.sample(jax.random.PRNGKey(1), 4000)
    moments = {k: _moments(q, np.asarray(draws[k])) for k, q in res.posterior.items() if k in draws}
    out.update(status="fitted", converged=bool(res.converged), iterations=int(res.num_steps))
    out["max_abs_z"], out["mean_abs_z"], out["median_sd_ratio"] = _z(moments, ref)
    out["elbo"] = float(res.elbo_final)
    best = (ref.get("svi") or {}).get("elbo_best")
    out["svi_elbo_best"] = best
    out["elbo_minus_svi_best"] = None if best is None else out["elbo"] - best
    if ref.get("svi"):
        try:
            out["svi"] = svi_to_reach(model, data, ref, out["elbo"], quick)
        except Exception as e:  # noqa: BLE001
            out["svi"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def bars(r) -> dict:
    if r.get("status") != "fitted":
        return {}
    svi_z = (r.get("svi") or {}).get("max_abs_z")
    out = {}
    if r.get("elbo_minus_svi_best") is not None:
        out["elbo"] = r["elbo_minus_svi_best"] >= -0.5
    if r.get("max_abs_z") is not None:
        out["z"] = r["max_abs_z"] <= max(0.1, (svi_z if svi_z is not None else 0.0) + 0.05)
    if r.get("median_sd_ratio") is not None:
        out["sd"] = 0.9 <= r["median_sd_ratio"] <= 1.1
    return out


def run(names=None, quick=False):
    names = names or list(models())
    timeout = 240 if quick else TIMEOUT
    results = {}
    for name in names:
        print(f"[zoo] {name}", flush=True)
        cmd = [sys.executable, "-m", "benchmarks.zoo", name] + (["--quick"] if quick else [])
        t = time.perf_counter()
        try:
            p = subprocess.run(cmd, cwd=D.ROOT, capture_output=True, text=True, timeout=timeout)
            line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{")), None)
            r = (
                json.loads(line)
                if line
                else {
                    "model": name,
                    "status": "crashed",
                    "error": p.stderr.strip().splitlines()[-1:],
                }
            )
        except subprocess.TimeoutExpired:
            r = {"model": name, "status": "timeout", "error": f"no result within {timeout} s"}
        r["process_seconds"] = time.perf_counter() - t
        r["bars"] = bars(r)
        results[name] = r
        print(f"[zoo] {name}: {r.get('status')} {r.get('error', '')}", flush=True)
    payload = {
        "benchmark": "zoo",
        "environment": D.environment(),
        "quick": quick,
        "timeout_seconds": timeout,
    }
    payload.update(bars=BARS, models=results)
    md = markdown(payload)
    D.write("zoo", payload, md)
    if names == list(models()):  # the docs page only from a full run
        (D.ROOT / "docs" / "zoo.md").write_text(md.replace("](zoo.png)", "](zoo.png)"))
        write_plot(payload, D.ROOT / "docs" / "zoo.png")
    print(md)
    return payload


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
    (
        "bars met",
        lambda k, r: ", ".join(f"{b} {'yes' if v else 'NO'}" for b, v in r["bars"].items()) or "—",
        None,
    ),
]


def markdown(p) -> str:
    res = p["models"]
    fitted = [r for r in res.values() if r["bars"]]
    all_met = [k for k, r in res.items() if r["bars"] and all(r["bars"].values())]
    counts = {b: sum(1 for r in fitted if r["bars"].get(b)) for b in ("elbo", "z", "sd")}
    return f"""# autocvi on the model zoo

{D.env_line(p["environment"], "zoo" + (" --quick" if p["quick"] else ""))}

Every model of `tests/zoo/models.py` with a reference in `tests/zoo/references/` (models without
one are listed as "no reference"), fitted by `autocvi.fit(model, **data)` with its defaults,
each in its own process (time limit {p["timeout_seconds"]} s: a hang is a "timeout"; an
exception is recorded as the user sees it). z = (mean_q - mean_NUTS) / sd_NUTS per element of
the latent sites; sd ratio = sd_q / sd_NUTS. ELBO: `FitResult.elbo_final` against the
reference's best SVI/Laplace ELBO (`svi.elbo_best`). Cold: the first `fit` in the process
(tracing and compilation included); warm: a second `fit` of the same model. SVI:
AutoMultivariateNormal + Adam at the reference's best learning rate for its step count, one
fused `lax.scan` (compile excluded), a 2,000-particle ELBO at 50 checkpoints; "SVI s to
autocvi's ELBO" is the first checkpoint at or above autocvi's ELBO. Speed-up = SVI's seconds
to autocvi's ELBO / autocvi's warm seconds.

**Summary**: {len(all_met)} of {len(res)} models meet every bar ({BARS}); of the {len(fitted)} fitted
with a reference: ELBO bar {counts["elbo"]}, z bar {counts["z"]}, sd bar {counts["sd"]}.
All bars met: {", ".join(f"`{k}`" for k in all_met) or "none"}.

{D.table(COLUMNS, res)}

![accuracy against speed-up](zoo.png)
"""


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


def main(argv=None):
    argv = argv or []
    run([a for a in argv if not a.startswith("-")] or None, quick="--quick" in argv)


if __name__ == "__main__":  # child process: one model, its record as the last line of stdout
    try:
        record = run_one(sys.argv[1], "--quick" in sys.argv)
    except Exception as e:  # noqa: BLE001
        record = {
            "model": sys.argv[1],
            "status": "crashed",
            "error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc(),
        }
    print(json.dumps(D.to_jsonable(record)))
