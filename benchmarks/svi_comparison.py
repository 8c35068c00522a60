"""autocvi against NumPyro SVI (autoguides, Adam at several learning rates) on one model: the
experiment ``logistic_regression:convergence|wide``, ``gp_classification`` and
``factor_models`` declare.

Every posterior (autocvi on its grid; SVI on a log grid, refined around each threshold
crossing by exact replay) is scored by one scorer, the common Monte Carlo ELBO unless the spec
gives another (an exact ELBO, a test loss); the reference is the best final value of any
method (``autocvi.fit`` included), and each threshold's first iteration and loop time are
compared with the best SVI setting's in the "Ratios" table.
"""

from __future__ import annotations

import numpy as np
from numpyro.optim import Adam

from . import driver as D

TIMING_TEXT = """An iteration is one CVI sweep or one Adam step. Loop times exclude
compilation and setup (reported separately), both sides timed as their own loops run
(`benchmarks/driver.py`): autocvi's per-iteration time is `CVI.run`'s compiled loop (the loop
`autocvi.fit` runs) divided by its iterations, in brackets one `CVI.update` call with its ELBO
fetched, as a Python loop sees it (no brackets: timed one `CVI.update` at a time); SVI's is its
`lax.scan` of `svi.update` (the loop `SVI.run` runs) divided by {svi_num_steps}. Fastest of the
repeats. SVI thresholds are the first step within them: a log grid of {svi_grid_points} steps,
refined between the grid points around the first hit down to single steps by exact replay."""


def autocvi_grid(st, steps):
    """Every iteration up to ``autocvi_score_every_until``, then a log grid."""
    until = min(steps, st.get("autocvi_score_every_until", steps))
    points = D.log_grid(steps, st.get("autocvi_score_points", 40), 0)
    return sorted(set(range(until + 1)) | set(points))


def autocvi_entry(st, label, model, data, steps, passes=1.0, **options):
    """autocvi (``CVI(model, **options)``) for ``steps`` iterations, scored on its grid."""
    m, grid = D.AutocviMethod(label, **options), autocvi_grid(st, steps)
    return D.Entry(m, model, data, steps, grid, passes, repeats=st.get("autocvi_repeats", 3))


def run(spec: dict, st: dict) -> dict:
    """``spec``: name, cmd, title, model, data, autocvi (a list of :class:`driver.Entry`),
    guides (label -> constructor, or (constructor, description, posterior_fn)), site; optional:
    score (q -> dict; default the common estimator: "elbo", "se", "test"), key ("elbo"),
    higher, relative, unit ("nat" or "%"), scoring (its description), test_metric (label, fn
    of q), svi_float32, fit (False: no ``autocvi.fit``), targets (the issue's), mc_check (the
    common estimator for autocvi's and the best SVI's final q), columns, panels, text (after
    the tables). ``st``: the settings (quick overrides applied)."""
    model, data, key = spec["model"], spec["data"], spec.get("key", "elbo")
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
            m = D.SVIMethod(label, make, Adam(lr), rng_key=st["svi_rng_key"], setting=setting)
            m.site, m.posterior_fn, m.float32 = spec.get("site"), post, f32
            entries.append(D.Entry(m, model, data, n_svi, grid, repeats=st.get("svi_repeats", 3)))
    fit, also = None, []
    if spec.get("fit", True):
        print(f"[{spec['name']}] autocvi.fit with defaults")
        fit = D.timed_fit(model, data, rng_key=st["autocvi_rng_key"])
        fit["score"] = score(fit["_result"].posterior)
        also = [fit["score"][key]]
    opts = {k: spec[k] for k in ("higher", "relative", "refine") if k in spec}
    methods, ref = D.experiment(
        entries, score, key=key, thresholds=st["thresholds"], also=also, **opts
    )
    if spec.get("mc_check"):
        svis = [k for k, m in methods.items() if m["kind"] == "svi"]
        for label in ("autocvi", max(svis, key=lambda k: methods[k]["final"][key])):
            m = methods[label]
            m["elbo_mc"] = est(m["_run"].posterior_at(m["num_steps"]))
    payload = {"benchmark": spec["name"], "title": spec["title"], "settings": st}
    payload.update(environment=D.environment(), reference=ref, autocvi_fit_defaults=fit)
    payload.update(methods=methods, test_metric_label=spec.get("test_metric", (None,))[0])
    payload["summary"] = summary(payload, spec.get("targets", True))
    md, panels = markdown(spec, payload), spec.get("panels", elbo_panels)(payload)
    D.write(spec["name"], payload, md, panels, spec["title"])
    print(md)
    return payload


def summary(p, targets) -> dict:
    """Per threshold: the SVI setting reaching it first, and the ratios of its cost to autocvi's
    (lower bounds, SVI's budget over autocvi's cost, when no SVI setting reaches it)."""
    methods, n_svi = p["methods"], p["settings"]["svi_num_steps"]
    svis = {k: m for k, m in methods.items() if m["kind"] == "svi"}
    cvi, out = methods["autocvi"], {}
    for thr in map(str, p["settings"]["thresholds"]):
        first = {k: m["hits"][thr]["iterations"] for k, m in svis.items()}
        best = min(svis, key=lambda k: (first[k] is None, first[k] or 0, svis[k]["gap"]))
        s, c = svis[best]["hits"][thr], cvi["hits"][thr]
        o = {"best_svi": best, "svi": s, "autocvi": c}
        for k, f in (("iteration", "iterations"), ("loop_time", "loop_time")):
            o[f"{k}_ratio"] = D.ratio(s[f], c[f])
            if s[f] is None and c[f]:
                fastest = min(m["per_iter_time"] * n_svi for m in svis.values())
                o[f"{k}_ratio_lower_bound"] = (n_svi if f == "iterations" else fastest) / c[f]
        s_total, c_total = (x["time_including_setup_and_compile"] for x in (s, c))
        o["total_time_ratio"] = D.ratio(s_total, c_total)
        out[thr] = o
    if targets:

        def at_least(o, k, bound):
            v = o[k] if o[k] is not None else o.get(k + "_lower_bound")
            return v is not None and v >= bound

        out["targets"] = {
            ">=50x fewer iterations to 1 nat": at_least(out["1.0"], "iteration_ratio", 50),
            ">=10x less wall-clock (loop) to 1 nat": at_least(out["1.0"], "loop_time_ratio", 10),
            "autocvi reaches 0.1 nat where SVI does not": cvi["hits"]["0.1"]["iterations"]
            is not None
            and all(m["hits"]["0.1"]["iterations"] is None for m in svis.values()),
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
    label = (lambda t: f"{float(t):g} nat") if unit == "nat" else (lambda t: f"{100 * float(t):g}%")
    return [
        ("threshold", lambda thr, o: label(thr), None),
        ("best SVI", "best_svi", None),
        ("SVI iters", D.at("svi", "iterations"), "d"),
        ("autocvi iters", D.at("autocvi", "iterations"), "d"),
        ("iteration ratio", _ratio("iteration_ratio"), None),
        ("SVI loop s", D.at("svi", "loop_time"), ".3g"),
        ("autocvi loop s", D.at("autocvi", "loop_time"), ".3g"),
        ("wall-clock ratio (loop)", _ratio("loop_time_ratio"), None),
        ("ratio incl. setup+compile", _ratio("total_time_ratio", ".2f"), None),
    ]


def _final(label, m):
    v = m["final"]["elbo"]
    return f"{v:.3f} ± {m['final']['se']:.3f}" if "se" in m["final"] else f"{v:.3f}"


ELBO_COLUMNS = [("final ELBO (± MC se)", _final, None), ("gap to ELBO*", "gap", ".3f")]


def _mc(label, m):
    return f"{m['elbo_mc'][0]:.2f} ± {m['elbo_mc'][1]:.2f}" if "elbo_mc" in m else "—"


def markdown(spec, p) -> str:
    st, methods, fi = p["settings"], p["methods"], p["autocvi_fit_defaults"]
    unit = spec.get("unit", "nat")
    cols = [*D.METHOD_COLUMNS, *D.hit_columns(st["thresholds"], unit)]
    cols += spec.get("columns", ELBO_COLUMNS)
    if spec.get("mc_check"):
        cols.append(("final ELBO, common MC estimator (± se)", _mc, None))
    cols += D.TIMING_COLUMNS
    if p["test_metric_label"]:
        cols.append((f"final {p['test_metric_label']}", D.at("final", "test"), ".4f"))
    variants = [k for k, m in methods.items() if m["kind"] == "autocvi" and k != "autocvi"]
    notes = [f"`{k}`: {methods[k]['setting']}." for k in variants]
    if p["test_metric_label"]:
        notes.append(f"Test metric: {p['test_metric_label']} ({st['test_metric_definition']}).")
    scoring = spec.get("scoring") or (
        f"Every posterior is scored by one estimator: {st['estimator_num_samples']} draws of q "
        "(shared key), numpyro `log_density` minus `log q`."
    )
    name = "ELBO" if unit == "nat" else "L"
    ref = f"Reference **{name}\\* = {p['reference']:.4f}**, the best final value of any method"
    ref += ", `autocvi.fit` included." if fi else "."
    ratios = {thr: p["summary"][thr] for thr in map(str, st["thresholds"])}
    targets = "".join(
        f"\n- {k}: **{'met' if v else 'not met'}**"
        for k, v in p["summary"].get("targets", {}).items()
    )
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


def elbo_panels(p) -> list:
    methods, ref = p["methods"], p["reference"]
    xlabel = "passes through the data (= iterations, full batch)"
    out = D.gap_panels(methods, ref, "elbo", "ELBO* - ELBO(q) [nats; floor 1e-3]", "passes", xlabel)
    lines = D.objective_lines(methods)
    out.append({"lines": lines, "log": "x", "ylim": (ref - 40, ref + 5), "hlines": [(ref, "--")]})
    out[-1].update(xlabel="iteration", ylabel="per-iteration objective trace")
    if p["test_metric_label"]:
        lines = D.metric_lines(methods, "test", x="passes")
        lo = np.nanmin([v for m in methods.values() for v in m["test"] if v is not None])
        out.append({"lines": lines, "log": "x", "ylim": (lo - 0.02, lo + 0.5), "legend": 0})
        out[-1].update(xlabel="passes", ylabel=p["test_metric_label"])
    return out
