"""autocvi against NumPyro SVI (autoguides, Adam at several learning rates) on one model:
the experiment ``logistic_regression:convergence`` and ``gp_classification`` declare.

Every posterior (autocvi after every iteration; SVI on a log grid, refined around each
threshold crossing) is scored by the common estimator; ELBO* is the best final ELBO.
"""

from __future__ import annotations

import time

import numpy as np
from numpyro.optim import Adam

from . import driver as D


def run(spec: dict, quick: bool = False) -> dict:
    """``spec``: name, title, model, data, settings, guides (label -> constructor), site,
    optional test_metric (label, fn of q), autocvi_variants [(method, model, data, steps,
    passes per iteration)]."""
    T0 = time.perf_counter()
    name, model, data, site = spec["name"], spec["model"], spec["data"], spec["site"]
    st = dict(spec["settings"])
    if quick:
        st.update(
            autocvi_num_steps=20, autocvi_mc_num_steps=30 if st.get("autocvi_mc_num_steps") else 0
        )
        st.update(svi_num_steps=2000, estimator_num_samples=min(8192, st["estimator_num_samples"]))
    est = D.ELBOEstimator(model, data, st["estimator_num_samples"], st["estimator_rng_key"])
    test_label, metric = spec.get("test_metric", (None, None))

    def score(q):
        v, se = est(q)
        return {"elbo": v, "se": se, "test": None if metric is None else float(metric(q))}

    n = st["autocvi_num_steps"]
    variants = [
        (D.AutocviMethod("autocvi", num_samples=st["autocvi_num_samples"]), model, data, n, 1.0)
    ]
    if st.get("autocvi_mc_num_steps"):
        mc = D.PlannedAutocviMethod(
            "autocvi-mc", num_samples=st["autocvi_num_samples"], use_quadrature=False
        )
        variants.append((mc, model, data, st["autocvi_mc_num_steps"], 1.0))
    variants += spec.get("autocvi_variants", [])
    runs, grids, passes = {}, {}, {}
    for method, m_model, m_data, steps, per in variants:
        print(f"[{name}] {method.label}: {steps} iterations ({time.perf_counter() - T0:.0f} s)")
        until = st.get("autocvi_score_every_until", steps)
        runs[method.label] = D.run(
            method, m_model, m_data, steps, repeats=st.get("autocvi_repeats", 3)
        )
        grids[method.label] = sorted(
            set(range(min(steps, until) + 1))
            | set(D.log_grid(steps, st.get("autocvi_score_points", 40), 0))
        )
        passes[method.label] = per
    print(f"[{name}] autocvi.fit with defaults ({time.perf_counter() - T0:.0f} s)")
    fit = D.timed_fit(model, data, rng_key=st["autocvi_rng_key"])
    fit["elbo_hp"], fit["elbo_hp_se"] = est(fit.pop("result").posterior)

    n_svi = st["svi_num_steps"]
    grid = [0] + D.log_grid(n_svi, st["svi_grid_points"])
    for (glabel, make_guide), lr in [
        (g, lr) for g in spec["guides"].items() for lr in st["svi_learning_rates"]
    ]:
        label = f"svi-{glabel}-adam-{lr:g}"
        print(f"[{name}] {label}: {n_svi} steps ({time.perf_counter() - T0:.0f} s)")
        m = D.SVIMethod(label, make_guide, Adam(lr), rng_key=st["svi_rng_key"], site=site)
        runs[label] = D.run(m, model, data, n_svi, keep=grid, repeats=st.get("svi_repeats", 3))
        runs[label].method.setting = f"{type(m.guide).__name__}, Adam lr={lr:g}, Trace_ELBO"
        grids[label], passes[label] = grid, 1.0

    print(f"[{name}] scoring and thresholds ({time.perf_counter() - T0:.0f} s)")
    cmp = D.compare(runs, score, grids, thresholds=())
    ref = max(cmp.pop("_ref"), fit["elbo_hp"])
    methods = {}
    for label, s in cmp.items():
        r = s.run
        m = D.timing(r, {"iters": s.iters, "passes": [i * passes[label] for i in s.iters]})
        m.update(elbo_hp=s.values["elbo"], elbo_hp_se=s.values["se"], test_metric=s.values["test"])
        m.update(final_elbo_hp=s.final("elbo"), final_gap=ref - s.final("elbo"))
        m["hits"] = {}
        for thr in st["thresholds_nats"]:  # against ELBO* including autocvi.fit's q
            it = (
                D.refine_hit(s.extra["evaluate"], s.iters, s.values["elbo"], ref - thr)
                if r.method.kind == "svi"
                else D.first_hit(s.iters, s.values["elbo"], ref - thr)
            )
            t = s.time_at(it)
            m["hits"][str(thr)] = {"iterations": it, "loop_time": t}
            if t is not None:
                m["hits"][str(thr)]["time_including_setup_and_compile"] = (
                    t + r.setup_time + r.compile_time
                )
        methods[label] = m
    payload = {
        "benchmark": name,
        "title": spec["title"],
        "settings": st,
        "environment": D.environment(),
        "reference_elbo": ref,
        "autocvi_fit_defaults": fit,
        "methods": methods,
        "test_metric_label": test_label,
    }
    payload["summary"] = summary(payload)
    md = markdown(payload)
    D.write(name, payload, md, panels(payload), spec["title"])
    print(md)
    return payload


def summary(p) -> dict:
    methods, n_svi = p["methods"], p["settings"]["svi_num_steps"]
    svis = {k: m for k, m in methods.items() if m["kind"] == "svi"}
    cvi, out = methods["autocvi"], {}
    for thr in map(str, p["settings"]["thresholds_nats"]):

        def key(k, thr=thr):
            it = svis[k]["hits"][thr]["iterations"]
            return (it is None, it or 0, -svis[k]["final_elbo_hp"])

        best = min(svis, key=key)
        s, c = svis[best]["hits"][thr], cvi["hits"][thr]
        o = {"best_svi": best, "svi": s, "autocvi": c}
        both = None not in (s["iterations"], c["iterations"])
        o["iteration_ratio"] = s["iterations"] / c["iterations"] if both else None
        o["loop_time_ratio"] = s["loop_time"] / c["loop_time"] if both else None
        o["total_time_ratio"] = (
            s["time_including_setup_and_compile"] / c["time_including_setup_and_compile"]
            if both
            else None
        )
        if s["iterations"] is None and c["iterations"]:  # lower bounds: SVI budget / autocvi cost
            o["iteration_ratio_lower_bound"] = n_svi / c["iterations"]
            o["loop_time_ratio_lower_bound"] = (
                min(m["per_iter_time"] * n_svi for m in svis.values()) / c["loop_time"]
            )
        out[thr] = o

    def at_least(o, k, bound):
        v = o[k] if o[k] is not None else o.get(k + "_lower_bound")
        return v is not None and v >= bound

    out["targets"] = {
        ">=50x fewer iterations to 1 nat": at_least(out["1.0"], "iteration_ratio", 50),
        ">=10x less wall-clock (loop) to 1 nat": at_least(out["1.0"], "loop_time_ratio", 10),
        "autocvi reaches 0.1 nat where SVI does not": cvi["hits"]["0.1"]["iterations"] is not None
        and all(m["hits"]["0.1"]["iterations"] is None for m in svis.values()),
    }
    return out


def _ratio_cell(o, k, peer, ours):
    if o.get(k + "_lower_bound") is not None:
        return f"> {o[k + '_lower_bound']:.0f}x (SVI does not reach)"
    return D.ratio(peer, ours).replace("peer", "SVI")


def hit(thr, what):
    return lambda label, m: m["hits"][thr][what]


METHOD_COLUMNS = [
    ("method", lambda label, m: label, None),
    ("setting", "setting", None),
    ("iters to 1 nat", hit("1.0", "iterations"), "d"),
    ("loop s to 1 nat", hit("1.0", "loop_time"), ".3g"),
    ("iters to 0.1 nat", hit("0.1", "iterations"), "d"),
    ("loop s to 0.1 nat", hit("0.1", "loop_time"), ".3g"),
    (
        "final ELBO (± MC se)",
        lambda label, m: f"{m['final_elbo_hp']:.3f} ± {m['elbo_hp_se'][-1]:.3f}",
        None,
    ),
    ("gap to ELBO*", "final_gap", ".3f"),
    *D.TIMING_COLUMNS,
]


def markdown(p) -> str:
    st, methods, fi = p["settings"], p["methods"], p["autocvi_fit_defaults"]
    cols = list(METHOD_COLUMNS)
    if p.get("test_metric_label"):
        cols.append(
            (f"final {p['test_metric_label']}", lambda label, m: m["test_metric"][-1], ".4f")
        )
    ratio_rows = []
    for thr in ("1.0", "0.1"):
        o = p["summary"][thr]
        s, c = o["svi"], o["autocvi"]
        ratio_rows.append(
            (
                f"{float(thr):g} nat",
                o["best_svi"],
                D.fmt(s["iterations"], "d"),
                D.fmt(c["iterations"], "d"),
                _ratio_cell(o, "iteration_ratio", s["iterations"], c["iterations"]),
                D.fmt(s["loop_time"], ".3g"),
                D.fmt(c["loop_time"], ".3g"),
                _ratio_cell(o, "loop_time_ratio", s["loop_time"], c["loop_time"]),
                D.fmt(o["total_time_ratio"], ".2f") + ("x" if o["total_time_ratio"] else ""),
            )
        )
    head = ("threshold", "best SVI", "SVI iters", "autocvi iters", "iteration ratio", "SVI loop s")
    head += ("autocvi loop s", "wall-clock ratio (loop)", "ratio incl. setup+compile")
    targets = "\n".join(
        f"- {k}: **{'met' if v else 'not met'}**" for k, v in p["summary"]["targets"].items()
    )
    notes = [
        f"`{k}`: {m['setting']}."
        for k, m in methods.items()
        if m["kind"] == "autocvi" and k != "autocvi"
    ]
    if p.get("test_metric_label"):
        notes.append(
            f"Test metric: {p['test_metric_label']} ({st.get('test_metric_definition', '')})."
        )
    return f"""# {p["title"]}: autocvi vs NumPyro SVI

{D.env_line(p["environment"], p["benchmark"])}

Model: {st["data"]}; {st["prior"]}; {st["likelihood"]}. Every posterior is scored by one
estimator: {st["estimator_num_samples"]} draws of q (shared key), numpyro `log_density` minus
`log q`. Reference **ELBO\\* = {p["reference_elbo"]:.4f}** (best final ELBO of any method,
`autocvi.fit` included). An iteration is one CVI sweep or one Adam step. Loop times exclude
compilation and setup (reported separately), both sides timed as their own loops run
(`benchmarks/driver.py`): autocvi's per-iteration time is `CVI.run`'s compiled loop (the loop
`autocvi.fit` runs) divided by its iterations, in brackets one `CVI.update` call with its ELBO
fetched, as a Python loop sees it; SVI's is its `lax.scan` of `svi.update` (the loop
`SVI.run` runs) divided by {st["svi_num_steps"]}. Fastest of the repeats. SVI thresholds are
the first step within them: a log grid of {st["svi_grid_points"]} steps, refined between the
grid points around the first hit down to single steps by exact replay.
{chr(10).join(notes)}

## Ratios: autocvi vs the best SVI setting

{D.md_table(head, ratio_rows)}

Targets from the issue:
{targets}

## All methods

{D.table(cols, methods)}

`autocvi.fit` with its defaults (as a user calls it): {fi["num_steps"]} iterations,
converged={fi["converged"]}, ELBO {fi["elbo_hp"]:.4f} (common estimator; engine's own
value {fi["final_elbo_engine"]:.4f}), {fi["wall_time_including_compile"]:.2f} s in the loop
including compilation, {fi["total_call_time"]:.2f} s for the whole call.
"""


def panels(p) -> list:
    methods, ref = p["methods"], p["reference_elbo"]
    lines = {k: [] for k in ("iter", "time", "native", "test")}
    for label, m in methods.items():
        it = np.asarray(m["iters"], float)
        gap = np.maximum(ref - np.asarray(m["elbo_hp"], float), 1e-3)
        style = "-" if m["kind"] == "svi" else "-o"
        lines["iter"].append((np.maximum(np.asarray(m["passes"], float), 0.05), gap, label, style))
        lines["time"].append((np.maximum(it * m["per_iter_time"], 1e-5), gap, label, style))
        obj = np.asarray(m["objective"], float)
        if m["kind"] == "svi":
            obj = np.convolve(obj, np.ones(100) / 100, mode="valid")
            lines["native"].append(
                (np.arange(100, 100 + len(obj)), obj, f"{label} (-loss, 100-step mean)", "-")
            )
        else:
            lines["native"].append(
                (np.arange(1, len(obj) + 1), obj, f"{label} (engine ELBO)", style)
            )
        if p.get("test_metric_label"):
            x = np.maximum(np.asarray(m["passes"], float), 0.05)
            lines["test"].append((x, np.asarray(m["test_metric"], float), label, style))
    gap_panel = {
        "log": "xy",
        "hlines": [(1.0, "--"), (0.1, ":")],
        "ylabel": "ELBO* - ELBO(q) [nats; floor 1e-3]",
    }
    out = [
        {
            **gap_panel,
            "lines": lines["iter"],
            "xlabel": "passes through the data (= iterations, full batch)",
        },
        {
            **gap_panel,
            "lines": lines["time"],
            "xlabel": "wall-clock s (loop, compile excluded)",
            "legend": 0,
        },
        {
            "lines": lines["native"],
            "log": "x",
            "ylim": (ref - 40, ref + 5),
            "hlines": [(ref, "--")],
            "xlabel": "iteration",
            "ylabel": "per-iteration objective trace",
        },
    ]
    if p.get("test_metric_label"):
        lo = np.nanmin([v for m in methods.values() for v in m["test_metric"] if v is not None])
        out.append(
            {
                "lines": lines["test"],
                "log": "x",
                "ylim": (lo - 0.02, lo + 0.5),
                "xlabel": "passes",
                "ylabel": p["test_metric_label"],
                "legend": 0,
            }
        )
    return out
