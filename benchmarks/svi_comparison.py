"""autocvi against NumPyro SVI (autoguides, Adam at several learning rates) on one model, the
experiment that ``logistic_regression:convergence|wide``, ``gp_classification`` and
``factor_models`` declare: every posterior scored by one scorer (the common Monte Carlo ELBO
unless the spec gives another), the reference the best final value of any method, and each
threshold's first iteration and loop time compared with the best SVI setting's ("Ratios").
"""

from functools import partial

import numpy as np
from numpyro.optim import Adam

from . import driver as D

DEFAULTS = {  # the settings every declaring benchmark starts from
    "autocvi_rng_key": 0,
    "autocvi_repeats": 3,
    "svi_learning_rates": [1e-3, 1e-2, 5e-2],
    "svi_rng_key": 0,
    "svi_repeats": 3,
    "estimator_rng_key": 12345,
    "thresholds": [1.0, 0.1],
}

TIMING_TEXT = """An iteration is one CVI sweep or one Adam step. Loop times exclude compilation
and setup (`benchmarks/README.md`): autocvi's is `CVI.run`'s compiled loop per iteration (in
brackets one `CVI.update` with its ELBO fetched; no brackets: timed one `CVI.update` at a
time), SVI's its `lax.scan` of `svi.update` over {svi_num_steps} steps; fastest of the repeats.
SVI's first step within a threshold: a log grid of {svi_grid_points} steps, refined by replay."""


def autocvi_entry(st, label, model, data, steps, passes=1.0, **options):
    """autocvi (``CVI(model, **options)``) for ``steps`` iterations, scored at every iteration
    up to ``autocvi_score_every_until``, then on a log grid."""
    until = min(steps, st.get("autocvi_score_every_until", steps))
    points = D.log_grid(steps, st.get("autocvi_score_points", 40), 0)
    grid = sorted(set(range(until + 1)) | set(points))
    m = D.AutocviMethod(label, **options)
    return D.Entry(m, model, data, steps, grid, passes, repeats=st["autocvi_repeats"])


def run(spec: dict, st: dict) -> dict:
    """``spec``: cmd (``name[:part]``, results in ``name_part.*``), title, autocvi (a list of
    :class:`driver.Entry`; the first one's model and data are SVI's and the scorer's), guides
    (label -> constructor, or (constructor, description, posterior_fn)), site; optional: score
    (q -> dict; default the common estimator), key, higher, relative, refine, unit ("nat" or
    "%"), scoring (its description), test_metric (label, fn of q), svi_float32, fit, targets,
    mc_check, columns, panels, text."""
    model, data, key = spec["autocvi"][0].model, spec["autocvi"][0].data, spec.get("key", "elbo")
    if "score" not in spec or spec.get("mc_check"):
        est = D.ELBOEstimator(model, data, st["estimator_num_samples"], st["estimator_rng_key"])
    metric = spec.get("test_metric", (None, None))[1]

    def mc_score(q):
        v, se = est(q)
        return {"elbo": v, "se": se} | ({} if metric is None else {"test": float(metric(q))})

    score = spec.get("score", mc_score)
    n_svi, f32 = st["svi_num_steps"], spec.get("svi_float32", False)
    grid = [0] + D.log_grid(n_svi, st["svi_grid_points"], st.get("svi_grid_dense", 20))
    entries = list(spec["autocvi"])
    for g, guide in spec["guides"].items():
        make, text, post = guide if isinstance(guide, tuple) else (guide, guide.__name__, None)
        for lr in st["svi_learning_rates"]:
            setting = f"{text}, Adam lr={lr:g}, Trace_ELBO" + (", float32" if f32 else "")
            label = f"svi-{g}-adam-{lr:g}" if g else f"svi-adam-{lr:g}"
            options = {"site": spec.get("site"), "posterior_fn": post, "float32": f32}
            m = D.SVIMethod(label, make, Adam(lr), None, st["svi_rng_key"], setting, **options)
            entries.append(D.Entry(m, model, data, n_svi, grid, repeats=st["svi_repeats"]))
    fit, also = None, []
    if spec.get("fit", True):
        print(f"[{spec['cmd']}] autocvi.fit with defaults")
        fit = D.timed_fit(model, data, rng_key=st["autocvi_rng_key"])
        fit["score"] = score(fit["_result"].posterior)
        also = [fit["score"][key]]
    opts = {k: spec[k] for k in ("higher", "relative", "refine") if k in spec}
    thresholds = st["thresholds"]
    methods, ref = D.experiment(entries, score, key=key, thresholds=thresholds, also=also, **opts)
    if spec.get("mc_check"):
        svis = [m for m in methods.values() if m["kind"] == "svi"]
        for m in (methods["autocvi"], max(svis, key=lambda m: m["final"][key])):
            m["elbo_mc"] = est(D.posterior_at(m, m["num_steps"]))
    out = {"title": spec["title"], "reference": ref, "autocvi_fit_defaults": fit}
    out.update(methods=methods, test_metric_label=spec.get("test_metric", (None,))[0])
    out["summary"] = summary(methods, st, spec.get("targets", True))
    name, panels = spec["cmd"].replace(":", "_"), spec.get("panels", elbo_panels)
    return D.publish(name, st, partial(markdown, spec), panels, spec["title"], **out)


def summary(methods, st, targets) -> dict:
    """Per threshold: the SVI setting reaching it first, and the ratios of its cost to autocvi's
    (lower bounds, SVI's budget over autocvi's cost, when no SVI setting reaches it)."""
    n_svi = st["svi_num_steps"]
    svis = {k: m for k, m in methods.items() if m["kind"] == "svi"}
    cvi, out = methods["autocvi"], {}
    for thr in map(str, st["thresholds"]):
        first = {k: m["hits"][thr]["iterations"] for k, m in svis.items()}
        best = min(svis, key=lambda k: (first[k] is None, first[k] or 0, svis[k]["gap"]))
        s, c = svis[best]["hits"][thr], cvi["hits"][thr]
        o = {"best_svi": best, "svi": s, "autocvi": c}
        for k, f in (("iteration", "iterations"), ("loop_time", "loop_time")):
            o[f"{k}_ratio"] = D.ratio(s[f], c[f])
            if s[f] is None and c[f]:
                fastest = min(m["per_iter_time"] * n_svi for m in svis.values())
                o[f"{k}_ratio_lower_bound"] = (n_svi if f == "iterations" else fastest) / c[f]
        o["total_time_ratio"] = D.ratio(*(x["time_including_setup_and_compile"] for x in (s, c)))
        out[thr] = o
    if targets:

        def at_least(k, bound):
            v = out["1.0"][k] if out["1.0"][k] is not None else out["1.0"].get(k + "_lower_bound")
            return v is not None and v >= bound

        reached = [m["hits"]["0.1"]["iterations"] is not None for m in (cvi, *svis.values())]
        out["targets"] = {
            ">=50x fewer iterations to 1 nat": at_least("iteration_ratio", 50),
            ">=10x less wall-clock (loop) to 1 nat": at_least("loop_time_ratio", 10),
            "autocvi reaches 0.1 nat where SVI does not": reached[0] and not any(reached[1:]),
        }
    return out


def _ratio(k, spec=".1f"):
    def cell(thr, o):
        if o.get(k + "_lower_bound") is not None:
            return f"> {o[k + '_lower_bound']:.0f}x (SVI does not reach)"
        v = o[k]
        return "—" if v is None else f"{v:{spec if v >= 0.1 else '.2g'}}x"

    return cell


def ratio_columns(unit):
    return [
        ("threshold", lambda thr, o: D.threshold_label(thr, unit), None),
        ("best SVI", "best_svi", None),
        ("SVI iters", D.at("svi", "iterations"), "d"),
        ("autocvi iters", D.at("autocvi", "iterations"), "d"),
        ("iteration ratio", _ratio("iteration_ratio"), None),
        ("SVI loop s", D.at("svi", "loop_time"), ".3g"),
        ("autocvi loop s", D.at("autocvi", "loop_time"), ".3g"),
        ("wall-clock ratio (loop)", _ratio("loop_time_ratio"), None),
        ("ratio incl. setup+compile", _ratio("total_time_ratio", ".2f"), None),
    ]


def _final(label, m):  # the common estimator's (a spec with its own score has its own columns)
    return f"{m['final']['elbo']:.3f} ± {m['final']['se']:.3f}"


ELBO_COLUMNS = [("final ELBO (± MC se)", _final, None), ("gap to ELBO*", "gap", ".3f")]


def _mc(label, m):
    return f"{m['elbo_mc'][0]:.2f} ± {m['elbo_mc'][1]:.2f}" if "elbo_mc" in m else "—"


def markdown(spec, p) -> str:
    st, methods, fi = p["settings"], p["methods"], p["autocvi_fit_defaults"]
    test, unit = p["test_metric_label"], spec.get("unit", "nat")
    cols = [*D.METHOD_COLUMNS, *D.hit_columns(st["thresholds"], unit)]
    cols += spec.get("columns", ELBO_COLUMNS)
    if spec.get("mc_check"):
        cols.append(("final ELBO, common MC estimator (± se)", _mc, None))
    cols += D.TIMING_COLUMNS
    variants = [k for k, m in methods.items() if m["kind"] == "autocvi" and k != "autocvi"]
    notes = [f"`{k}`: {methods[k]['setting']}." for k in variants]
    if test:
        cols.append((f"final {test}", D.at("final", "test"), ".4f"))
        notes.append(f"Test metric: {test} ({st['test_metric_definition']}).")
    scoring = spec.get("scoring") or (
        f"Every posterior is scored by one estimator: {st['estimator_num_samples']} draws of q "
        "(shared key), numpyro `log_density` minus `log q`."
    )
    ref = f"Reference **{'ELBO' if unit == 'nat' else 'L'}\\* = {p['reference']:.4f}**, the best "
    ref += "final value of any method" + (", `autocvi.fit` included." if fi else ".")
    ratios = {thr: p["summary"][thr] for thr in map(str, st["thresholds"])}
    targets = p["summary"].get("targets", {}).items()
    targets = "".join(f"\n- {k}: **{'met' if v else 'not met'}**" for k, v in targets)
    fit = "" if fi is None else D.fit_line(fi, f"ELBO {fi['score']['elbo']:.4f} by the same scorer")
    return f"""# {p["title"]}: autocvi vs NumPyro SVI

{D.env_line(p["environment"], spec["cmd"])}

{st["data"]}; {st["prior"]}; {st["likelihood"]}. {scoring} {ref}
{TIMING_TEXT.format(**st)}
{chr(10).join(notes)}

## Ratios: autocvi vs the best SVI setting

{D.table(ratio_columns(unit), ratios)}
{"" if not targets else chr(10) + "Targets from the issue:" + targets}

## All methods

{D.table(cols, methods)}

{fit}
{spec["text"](p) if callable(spec.get("text")) else spec.get("text", "")}
"""


def elbo_panels(plt, p) -> list:
    methods, ref, test = p["methods"], p["reference"], p["test_metric_label"]
    xlabel = "passes through the data (= iterations, full batch)"
    out = D.gap_panels(methods, ref, "elbo", "ELBO* - ELBO(q) [nats; floor 1e-3]", "passes", xlabel)
    lines = D.objective_lines(methods)
    out.append({"lines": lines, "log": "x", "ylim": (ref - 40, ref + 5), "hlines": [(ref, "--")]})
    out[-1].update(xlabel="iteration", ylabel="per-iteration objective trace")
    if test:
        lo = np.nanmin([v for m in methods.values() for v in m["test"] if v is not None])
        lines = D.metric_lines(methods, "test", x="passes")
        out.append({"lines": lines, "log": "x", "ylim": (lo - 0.02, lo + 0.5), "legend": 0})
        out[-1].update(xlabel="passes", ylabel=test)
    return out
