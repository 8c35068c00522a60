"""Shared driver: autocvi against NumPyro SVI (autoguides, Adam at several
learning rates) on one model and data set, in one process.

Every posterior (each autocvi iteration; SVI on a log-spaced grid of steps,
refined around each threshold crossing) is scored by the same Monte Carlo
ELBO estimator (numpyro ``log_density`` of the model minus ``log q``, one
shared key). The reference optimum ``ELBO*`` is the best final ELBO of any
method under that estimator. Used by ``logistic_regression`` and
``gp_classification``.
"""

from __future__ import annotations

import inspect
import time

import jax
import numpy as np
from numpyro.infer import SVI, Trace_ELBO
from numpyro.optim import Adam

from . import common


def _has_quadrature_switch() -> bool:
    from autocvi.plan.schedule import build_schedule

    return "use_quadrature" in inspect.signature(build_schedule).parameters


def run(spec: dict, quick: bool = False) -> dict:
    """Run one comparison. ``spec``: name, title, model, data, settings, guides
    (label -> guide constructor taking the model), site (the latent's name)."""
    T0 = time.perf_counter()
    NAME, model, data, site = spec["name"], spec["model"], spec["data"], spec["site"]
    settings = dict(spec["settings"])
    if quick:
        settings.update(
            autocvi_num_steps=20,
            autocvi_mc_num_steps=30 if settings.get("autocvi_mc_num_steps") else 0,
            svi_num_steps=2000,
            svi_grid_points=40,
            estimator_num_samples=min(8192, settings["estimator_num_samples"]),
        )
    estimator = common.ELBOEstimator(
        model, data, settings["estimator_num_samples"], settings["estimator_rng_key"]
    )
    methods = {}

    # ------------------------------------------------------------ autocvi runs
    import autocvi

    test_label, test_metric = spec.get("test_metric", (None, None))

    def score(q):
        """(ELBO, its MC se, test metric or None) of a posterior dict."""
        v, se = estimator(common.independent_q(q))
        return v, se, None if test_metric is None else float(test_metric(q))

    variants = [
        dict(label="autocvi", model=model, data=data, num_steps=settings["autocvi_num_steps"])
    ]
    if _has_quadrature_switch() and settings.get("autocvi_mc_num_steps"):
        variants.append(
            dict(
                label="autocvi-mc",
                model=model,
                data=data,
                num_steps=settings["autocvi_mc_num_steps"],
                use_quadrature=False,
            )
        )
    variants += spec.get("autocvi_variants", [])
    for var in variants:
        label, n = var["label"], var["num_steps"]
        print(f"[{NAME}] {label}: {n} iterations ({time.perf_counter() - T0:.0f} s)")
        r = common.run_autocvi(
            var["model"],
            var["data"],
            n,
            rng_key=settings["autocvi_rng_key"],
            num_samples=settings["autocvi_num_samples"],
            use_quadrature=var.get("use_quadrature"),
            repeats=settings.get("autocvi_repeats", 3),
            host_sync_loop=settings.get("autocvi_host_sync_loop", True),
        )
        kinds = sorted({k for node in r["schedule"].nodes.values() for _, k in node.incoming})
        # Score every iteration up to ``autocvi_score_every_until``, then a log grid.
        until = settings.get("autocvi_score_every_until", n)
        scored = sorted(
            set(range(0, min(n, until) + 1))
            | {0, n}
            | set(common.log_grid(n, settings.get("autocvi_score_points", 40), dense=0))
        )
        scores = [score(common.autocvi_posterior(r["schedule"], r["states"][i])) for i in scored]
        passes = var.get("passes_per_iteration", 1.0)
        sub = r["schedule"].factors
        subsampled = sorted(
            {f"{p.name}[{p.subsample_size}/{p.size}]" for f in sub.values() for p in f.subsampled}
        )
        methods[label] = {
            "kind": "autocvi",
            "setting": f"messages: {', '.join(kinds)}; beta={r['schedule'].step_size:g}"
            + (f"; subsampled {', '.join(subsampled)}" if subsampled else "")
            + (f"; {var['note']}" if var.get("note") else ""),
            "iters": scored,
            "passes": [i * passes for i in scored],
            "elbo_hp": [v for v, _, _ in scores],
            "elbo_hp_se": [se for _, se, _ in scores],
            "test_metric": [t for _, _, t in scores],
            "elbo_engine": r["elbo"],
            "iter_times": r["iter_times"],
            "cum_time": np.concatenate([[0.0], np.cumsum(r["iter_times"])]),
            "setup_time": r["setup_time"],
            "compile_time": r["compile_time"],
            "scan_compile_time": r["scan_compile_time"],
            "per_iter_time": float(np.median(r["iter_times"])),
            "scan_elbo_matches_step_loop": r["scan_elbo_matches_step_loop"],
            "schedule": str(r["schedule"]),
        }
        if r["iter_times_host_sync"] is not None:
            methods[label]["per_iter_time_host_sync"] = float(np.median(r["iter_times_host_sync"]))

    print(f"[{NAME}] autocvi.fit with defaults ({time.perf_counter() - T0:.0f} s)")
    t0 = time.perf_counter()
    res = autocvi.fit(model, data, rng_key=settings["autocvi_rng_key"], progress_bar=False)
    fit_total = time.perf_counter() - t0
    v, s = estimator(common.independent_q(res.posterior))
    fit_info = common.fit_summary(res)
    fit_info.update(
        total_call_time=fit_total,
        elbo_hp=v,
        elbo_hp_se=s,
        engine_trace_matches_instrumented=bool(
            np.allclose(
                res.elbo[: len(methods["autocvi"]["elbo_engine"])],
                methods["autocvi"]["elbo_engine"][: len(res.elbo)],
                rtol=1e-5,
                atol=1e-3,
            )
        ),
    )

    # -------------------------------------------------------------------- SVI
    n_svi = settings["svi_num_steps"]
    grid = common.log_grid(n_svi, settings["svi_grid_points"])
    for (guide_label, make_guide), lr in [
        (g, lr) for g in spec["guides"].items() for lr in settings["svi_learning_rates"]
    ]:
        label = f"svi-{guide_label}-adam-{lr:g}"
        print(f"[{NAME}] {label}: {n_svi} steps ({time.perf_counter() - T0:.0f} s)")
        guide = make_guide(model)
        svi = SVI(model, guide, Adam(lr), Trace_ELBO())
        r = common.run_svi(
            svi,
            data,
            n_svi,
            rng_key=settings["svi_rng_key"],
            repeats=settings.get("svi_repeats", 3),
            check_run=settings.get("svi_check_run", True),
        )
        params_at = r["params_at"]

        def evaluate(t, guide=guide, params_at=params_at):
            q = guide.get_posterior(params_at(t))
            return estimator(common.independent_q({site: q}))

        # step 0 = the initial guide
        p0 = svi.get_params(svi.init(jax.random.PRNGKey(settings["svi_rng_key"]), **data))
        vals = [score({site: guide.get_posterior(p0)})]
        vals += [score({site: guide.get_posterior(params_at(t))}) for t in grid]
        methods[label] = {
            "kind": "svi",
            "setting": f"{type(guide).__name__}, Adam lr={lr:g}, Trace_ELBO",
            "learning_rate": lr,
            "iters": [0] + grid,
            "passes": [0] + grid,
            "elbo_hp": [v for v, _, _ in vals],
            "elbo_hp_se": [se for _, se, _ in vals],
            "test_metric": [t for _, _, t in vals],
            "neg_loss": -r["losses"],
            "setup_time": r["setup_time"],
            "compile_time": r["compile_time"],
            "loop_time": r["loop_time"],
            "loop_times_all_repeats": r["loop_times_all_repeats"],
            "svi_run_time_including_compile": r["svi_run_time_including_compile"],
            "svi_run_losses_match": r["svi_run_losses_match"],
            "per_iter_time": r["loop_time"] / n_svi,
            "_evaluate": evaluate,
        }

    print(f"[{NAME}] thresholds ({time.perf_counter() - T0:.0f} s)")
    # ------------------------------------------------------ reference, thresholds
    finals = {k: m["elbo_hp"][-1] for k, m in methods.items()}
    finals["autocvi.fit (defaults)"] = fit_info["elbo_hp"]
    ref = max(v for v in finals.values() if np.isfinite(v))
    best_any = max(max(v for v in m["elbo_hp"] if np.isfinite(v)) for m in methods.values())
    for m in methods.values():
        m["final_elbo_hp"] = m["elbo_hp"][-1]
        m["final_gap"] = ref - m["elbo_hp"][-1]
        m["hits"] = {}
        for thr in settings["thresholds_nats"]:
            target = ref - thr
            if m["kind"] == "svi":
                it, extra = common.refine_first_hit(
                    lambda t, m=m: m["_evaluate"](t)[0], m["iters"], m["elbo_hp"], target
                )
                t = None if it is None else it / n_svi * m["loop_time"]
                m.setdefault("refined_evaluations", {}).update(extra)
            else:
                it = common.first_hit(m["iters"], m["elbo_hp"], target)
                t = None if it is None else float(m["cum_time"][it])
            m["hits"][str(thr)] = {"iterations": it, "loop_time": t}
            if t is not None:
                m["hits"][str(thr)]["time_including_setup_and_compile"] = (
                    t + m["setup_time"] + m["compile_time"]
                )
        m.pop("_evaluate", None)

    payload = {
        "benchmark": NAME,
        "settings": settings,
        "environment": common.environment(),
        "reference_elbo": ref,
        "reference_definition": "max over methods of the final posterior's ELBO under the common estimator",
        "best_elbo_any_checkpoint": best_any,
        "final_elbo_by_method": finals,
        "autocvi_fit_defaults": fit_info,
        "methods": methods,
        "test_metric_label": test_label,
    }
    payload["summary"] = _summary(payload)
    payload["title"] = spec["title"]
    md = _markdown(payload)
    common.write_results(NAME, payload, md, lambda plt: _plot(plt, payload))
    print(md)
    return payload


def _best_svi(methods, thr):
    """The SVI setting with the fewest iterations to ``thr`` (then the best final ELBO)."""
    svis = {k: m for k, m in methods.items() if m["kind"] == "svi"}

    def key(k):
        it = svis[k]["hits"][str(thr)]["iterations"]
        return (it is None, it if it is not None else 0, -svis[k]["final_elbo_hp"])

    return min(svis, key=key)


def _summary(p) -> dict:
    methods = p["methods"]
    cvi = methods["autocvi"]
    out = {}
    for thr in p["settings"]["thresholds_nats"]:
        best = _best_svi(methods, thr)
        s, c = methods[best]["hits"][str(thr)], cvi["hits"][str(thr)]
        out[str(thr)] = {
            "best_svi": best,
            "svi_iterations": s["iterations"],
            "autocvi_iterations": c["iterations"],
            "svi_loop_time": s["loop_time"],
            "autocvi_loop_time": c["loop_time"],
            "iteration_ratio": None
            if None in (s["iterations"], c["iterations"])
            else s["iterations"] / c["iterations"],
            "loop_time_ratio": None
            if None in (s["loop_time"], c["loop_time"])
            else s["loop_time"] / c["loop_time"],
            "total_time_ratio": None
            if None in (s["loop_time"], c["loop_time"])
            else s["time_including_setup_and_compile"] / c["time_including_setup_and_compile"],
        }
    # When no SVI setting reaches a threshold within its budget, the ratios are
    # at least (SVI's budget) / (autocvi's cost): record those lower bounds.
    n_svi = p["settings"]["svi_num_steps"]
    for thr, o in out.items():
        c = cvi["hits"][thr]
        o["iteration_ratio_lower_bound"] = o["loop_time_ratio_lower_bound"] = None
        if o["svi_iterations"] is None and c["iterations"]:
            fastest = min(m["loop_time"] for m in methods.values() if m["kind"] == "svi")
            o["iteration_ratio_lower_bound"] = n_svi / c["iterations"]
            o["loop_time_ratio_lower_bound"] = fastest / c["loop_time"]
    one, tenth = out["1.0"], out["0.1"]

    def at_least(o, key, bound):
        value = o[key] if o[key] is not None else o[key + "_lower_bound"]
        return value is not None and value >= bound

    out["targets"] = {
        ">=50x fewer iterations to 1 nat": at_least(one, "iteration_ratio", 50),
        ">=10x less wall-clock (loop) to 1 nat": at_least(one, "loop_time_ratio", 10),
        "autocvi reaches 0.1 nat where SVI does not": tenth["autocvi_iterations"] is not None
        and all(
            m["hits"]["0.1"]["iterations"] is None for m in methods.values() if m["kind"] == "svi"
        ),
    }
    return out


def _ratio_cell(s, key, peer, ours):
    if s.get(key + "_lower_bound") is not None:
        return f"> {s[key + '_lower_bound']:.0f}x (SVI does not reach)"
    return common.ratio(peer, ours, peer_name="SVI")


def _markdown(p) -> str:
    f = common.fmt
    methods, st = p["methods"], p["settings"]
    env = p["environment"]
    rows = []
    for label, m in methods.items():
        h1, h2 = m["hits"]["1.0"], m["hits"]["0.1"]
        rows.append(
            (
                label,
                m["setting"],
                f(h1["iterations"], "d"),
                f(h1["loop_time"], ".3g"),
                f(h2["iterations"], "d"),
                f(h2["loop_time"], ".3g"),
                f"{m['final_elbo_hp']:.3f} ± {m['elbo_hp_se'][-1]:.3f}",
                f(m["final_gap"], ".3f"),
                *common.timing_cells(m),
            )
            + ((f(m["test_metric"][-1], ".4f"),) if p.get("test_metric_label") else ())
        )
    table = common.md_table(
        (
            "method",
            "setting",
            "iters to 1 nat",
            "loop s to 1 nat",
            "iters to 0.1 nat",
            "loop s to 0.1 nat",
            "final ELBO (± MC se)",
            "gap to ELBO*",
            "ms / iter",
            "compile s",
            "setup s",
        )
        + ((f"final {p['test_metric_label']}",) if p.get("test_metric_label") else ()),
        rows,
    )
    srows = []
    for thr in ("1.0", "0.1"):
        s = p["summary"][thr]
        srows.append(
            (
                f"{float(thr):g} nat",
                s["best_svi"],
                f(s["svi_iterations"], "d"),
                f(s["autocvi_iterations"], "d"),
                _ratio_cell(s, "iteration_ratio", s["svi_iterations"], s["autocvi_iterations"]),
                f(s["svi_loop_time"], ".3g"),
                f(s["autocvi_loop_time"], ".3g"),
                _ratio_cell(s, "loop_time_ratio", s["svi_loop_time"], s["autocvi_loop_time"]),
                "—" if s["total_time_ratio"] is None else f"{s['total_time_ratio']:.2f}x",
            )
        )
    ratios = common.md_table(
        (
            "threshold",
            "best SVI",
            "SVI iters",
            "autocvi iters",
            "iteration ratio",
            "SVI loop s",
            "autocvi loop s",
            "wall-clock ratio (loop)",
            "ratio incl. setup+compile",
        ),
        srows,
    )
    fi = p["autocvi_fit_defaults"]
    targets = "\n".join(
        f"- {k}: **{'met' if v else 'not met'}**" for k, v in p["summary"]["targets"].items()
    )
    mc_note = ""
    if "autocvi-mc" in methods:
        mc_note = (
            "`autocvi-mc` is the same engine with Gauss-Hermite messages switched off "
            "(`use_quadrature=False`: Bonnet/Price Monte Carlo messages with "
            f"{st['autocvi_num_samples']} draws); its own per-iteration ELBO is then a "
            "Monte Carlo estimate too.\n"
        )
    NAME = p["benchmark"]
    return f"""# {p["title"]}: autocvi vs NumPyro SVI

Generated by `python -m benchmarks {NAME}` on {env["date"]} —
{env["machine"]["cpu"]} ({env["machine"]["cpu_count"]} CPUs, JAX backend {env["machine"]["jax_backend"]});
jax {env["versions"]["jax"]}, numpyro {env["versions"]["numpyro"]}, autocvi {env["versions"]["autocvi"]}
at git {str(env["git_commit"])[:10]}{" (engine files modified in the work tree)" if env["autocvi_worktree_dirty"] else ""}.

Model: {st["data"]}; {st["prior"]}; {st["likelihood"]}.
Every posterior is scored by one estimator: {st["estimator_num_samples"]} draws of q
(shared key), numpyro `log_density` minus `log q`. Reference **ELBO\\* = {p["reference_elbo"]:.4f}**
(best final ELBO of any method; best at any checkpoint: {p["best_elbo_any_checkpoint"]:.4f}).
An iteration is one CVI sweep or one Adam step. Loop times exclude compilation and
setup (reported separately). Both sides are timed the way their own loops run:
autocvi's time to iteration t is t/T of the measured `lax.scan` of T CVI steps (the
loop `autocvi.fit` runs, in chunks, with the ELBO computed every iteration); SVI's
time to step t is t/{st["svi_num_steps"]} of the measured `lax.scan` time (the loop
`SVI.run(progress_bar=False)` runs). Both loops are run 3 times from the same start
(identical results) and the fastest kept, since the machine may be shared; in brackets
in the "ms / iter" column, autocvi's time for one jitted step with a host sync (as a
Python loop sees it). SVI thresholds are the
first step whose posterior is within the threshold (checked on a log grid of
{st["svi_grid_points"]} steps, then refined between the two grid points around the first hit: at most 40 evenly spaced steps, then step by step).
{mc_note}{_variants_note(p)}
## Ratios: autocvi vs the best SVI setting

{ratios}

Targets from the issue:
{targets}

## All methods

{table}

`autocvi.fit` with its defaults (as a user calls it): {fi["num_steps"]} iterations,
converged={fi["converged"]}, ELBO {fi["elbo_hp"]:.4f} (common estimator; engine's own
value {fi["final_elbo_engine"]:.4f}), {fi["wall_time_including_compile"]:.2f} s in the loop
including compilation, {fi["total_call_time"]:.2f} s for the whole call.
"""


def _variants_note(p) -> str:
    st = p["settings"]
    lines = []
    if st.get("autocvi_score_every_until") is not None:
        lines.append(
            f"autocvi's posteriors are scored after every iteration up to "
            f"{st['autocvi_score_every_until']}, then on a log grid; its thresholds are the first "
            "scored iteration within them."
        )
    extra = [k for k in p["methods"] if k.startswith("autocvi-") and k != "autocvi-mc"]
    for k in extra:
        lines.append(f"`{k}`: {p['methods'][k]['setting']}.")
    if p.get("test_metric_label"):
        lines.append(
            f"Test metric: {p['test_metric_label']} ({p['settings'].get('test_metric_definition', '')})."
        )
    return "\n".join(lines) + ("\n" if lines else "")


def _plot(plt, p):
    methods, ref = p["methods"], p["reference_elbo"]
    has_test = bool(p.get("test_metric_label"))
    ncols = 4 if has_test else 3
    fig, axes = plt.subplots(1, ncols, figsize=(5.7 * ncols, 4.8))
    for label, m in methods.items():
        it = np.asarray(m["iters"], float)
        gap = np.maximum(ref - np.asarray(m["elbo_hp"], float), 1e-3)
        if m["kind"] == "svi":
            t = it / p["settings"]["svi_num_steps"] * m["loop_time"]
            style = "-"
        else:
            t = np.asarray(m["cum_time"])[np.asarray(m["iters"], int)]
            style = "-o"
        x = np.maximum(np.asarray(m.get("passes", it), float), 0.05)
        if has_test:
            axes[3].plot(x, np.asarray(m["test_metric"], float), style, ms=3, label=label)
        axes[0].plot(x, gap, style, ms=3, label=label)
        axes[1].plot(np.maximum(t, 1e-5), gap, style, ms=3, label=label)
        if m["kind"] == "svi":
            nl = np.asarray(m["neg_loss"])
            k = 100
            smooth = np.convolve(nl, np.ones(k) / k, mode="valid")
            axes[2].plot(np.arange(k, len(nl) + 1), smooth, label=f"{label} (-loss, 100-step mean)")
        else:
            axes[2].plot(
                np.arange(1, len(m["elbo_engine"]) + 1),
                m["elbo_engine"],
                style,
                ms=3,
                label=f"{label} (engine ELBO)",
            )
    for ax in axes[:2]:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.axhline(1.0, color="k", lw=0.6, ls="--")
        ax.axhline(0.1, color="k", lw=0.6, ls=":")
        ax.set_ylabel("ELBO* - ELBO(q)  [nats, common estimator; floor 1e-3]")
    axes[0].set_xlabel("passes through the data (= iterations for full-batch methods)")
    if has_test:
        axes[3].set_xscale("log")
        axes[3].set_xlabel("passes through the data")
        axes[3].set_ylabel(p["test_metric_label"])
        finite = [
            v
            for m in methods.values()
            for v in m["test_metric"]
            if v is not None and np.isfinite(v)
        ]
        if finite:
            lo = min(finite)
            axes[3].set_ylim(lo - 0.02, lo + 0.5)
    axes[1].set_xlabel("wall-clock s (loop, compile excluded)")
    axes[0].legend(fontsize=8)
    axes[2].set_xscale("log")
    axes[2].set_ylim(ref - 40, ref + 5)
    axes[2].axhline(ref, color="k", lw=0.6, ls="--")
    axes[2].set_xlabel("iteration")
    axes[2].set_ylabel("per-iteration objective trace")
    axes[2].legend(fontsize=7)
    fig.suptitle(p["title"])
    return fig


def rerender(name: str) -> str:
    """Rebuild the summary, markdown and plot of a finished run from its JSON record."""
    import json

    payload = json.loads((common.RESULTS / f"{name}.json").read_text())
    for m in payload["methods"].values():
        m["elbo_hp"] = [float("nan") if v is None else v for v in m["elbo_hp"]]
    payload["summary"] = _summary(payload)
    md = _markdown(payload)
    common.write_results(name, payload, md, lambda plt: _plot(plt, payload))
    return md
