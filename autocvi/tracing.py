"""Turn a NumPyro model and its data into a :class:`~autocvi.graph.FactorGraph`.

The model is run once under NumPyro's ``seed`` and ``trace`` handlers to
record its sites and plates. Each factor's dependencies on latent sites are
then read off the jaxpr of its log density (a backward liveness pass), which
sees through ``numpyro.deterministic``, ``lax.scan`` and any JAX code between
sites, and also finds the ``numpyro.param`` sites a factor uses. No inference
happens here.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.distributions import constraints

from .graph import FactorGraph, FactorNode, ParamNode, PlateInfo, VariableNode

__all__ = ["trace", "ModelError", "base_distribution", "support_name"]


class ModelError(ValueError):
    """The model or its data cannot be traced; the message names the site and the fix."""


class _SiteRecorder(numpyro.primitives.Messenger):
    """Remembers the last site the model reached, to locate errors."""

    def __init__(self, fn=None):
        self.last_site: str | None = None
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] in ("sample", "param", "deterministic", "plate"):
            self.last_site = msg["name"]


def trace(
    model: Callable,
    data: Mapping[str, Any] | None = None,
    *,
    classify: bool = True,
    rng_key: jax.Array | int = 0,
) -> FactorGraph:
    """Trace ``model(**data)`` into the factor graph autocvi sees.

    Args:
        model: a NumPyro model function.
        data: keyword arguments for the model (the NumPyro idiom
            ``def model(X, y=None)``), observations included.
        classify: also decide every latent's variational family and every
            factor-latent edge's conjugacy verdict (``autocvi.conjugacy``).
        rng_key: seed for the one model run that draws example latent values.

    Returns:
        a :class:`FactorGraph` with one variable per sample site, one factor
        per site density and ``numpyro.factor``, params as hyperparameters.

    Raises:
        ModelError: the data do not fit the model (unknown or missing
            argument, missing observations, non-finite observations, shapes
            that disagree with the plates) or the model raised; the message
            names the site and says what to do.
    """
    data = dict(data or {})
    _check_arguments(model, data)
    seed = int(rng_key) if isinstance(rng_key, int) else rng_key
    model_trace = _run_model(model, data, seed)
    _check_missing_observations(model, data, model_trace)

    plates = _plates(model_trace)
    variables: dict[str, VariableNode] = {}
    params: dict[str, ParamNode] = {}
    factor_vars: dict[str, VariableNode] = {}
    example: dict[str, Any] = {}
    factor_sites = set()
    for name, site in model_trace.items():
        if site["type"] == "sample":
            var = _variable(site, plates)
            if _is_factor_site(site):
                # numpyro.factor is a sample site only by implementation: it is a
                # factor of the graph, not a variable.
                factor_sites.add(name)
                factor_vars[name] = var
                continue
            variables[name] = var
            if var.observed:
                _check_observed_value(site, var)
            else:
                example[name] = site["value"]
        elif site["type"] == "param":
            params[name] = ParamNode(
                name=name,
                shape=tuple(jnp.shape(site["value"])),
                constraint=support_name(site["kwargs"].get("constraint", constraints.real)),
            )
            example[name] = site["value"]
    plate_values = {
        name: site["value"]
        for name, site in model_trace.items()
        if site["type"] == "plate" and plates[name].subsampled
    }

    builder = _site_fn_builder(model, data, plate_values)
    factors = {}
    for name, site in model_trace.items():
        if site["type"] != "sample":
            continue
        var = variables.get(name) or factor_vars[name]
        used = _used_inputs(_log_density(builder(name)), example)
        if name in factor_sites:
            kind = "factor"
        else:
            kind = "likelihood" if var.observed else "prior"
        factors[name] = FactorNode(
            name=name,
            site=name,
            kind=kind,
            latents=tuple(n for n in example if n in used and n in variables),
            params=tuple(n for n in example if n in used and n in params),
            plates=var.plates,
            distribution="factor" if kind == "factor" else var.distribution,
        )
    graph = FactorGraph(
        variables=variables,
        factors=factors,
        params=params,
        _site_fn_builder=builder,
        _example_values=example,
    )
    if classify:
        from .conjugacy import classify_graph

        graph = classify_graph(graph)
    return graph


# ---------------------------------------------------------------- helpers


def base_distribution(fn):
    """Strip numpyro's shape/mask wrappers (Expanded, Independent, Masked)."""
    while True:
        inner = getattr(fn, "base_dist", None)
        if inner is None or type(fn).__name__ not in (
            "ExpandedDistribution",
            "Independent",
            "MaskedDistribution",
        ):
            return fn
        fn = inner


def support_name(c) -> str:
    """A short readable name for a numpyro constraint."""
    if isinstance(c, constraints.independent):
        return f"{support_name(c.base_constraint)}^{c.reinterpreted_batch_ndims}"
    name = type(c).__name__.lstrip("_")
    for suffix in ("Constraint",):
        name = name.removesuffix(suffix)
    return name[:1].lower() + name[1:] if name else repr(c)


def _is_factor_site(site: dict) -> bool:
    return type(site["fn"]).__name__ == "Unit" and site["is_observed"]


def _check_arguments(model: Callable, data: dict) -> None:
    try:
        sig = inspect.signature(model)
    except (TypeError, ValueError):
        return
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    for key in data:
        if key not in params:
            close = difflib.get_close_matches(key, accepted, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ModelError(
                f"data has a key {key!r} that {_name(model)}() does not accept; it accepts "
                f"({', '.join(accepted)}).{hint} Rename or drop the key."
            )
    for n, p in params.items():
        if (
            p.default is inspect.Parameter.empty
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            and n not in data
        ):
            raise ModelError(
                f"{_name(model)}() needs the argument {n!r} but data has no {n!r}; "
                f"pass data={{{n!r}: ..., ...}}."
            )


def _run_model(model: Callable, data: dict, seed) -> dict:
    recorder = _SiteRecorder()
    try:
        with recorder:
            return handlers.trace(handlers.seed(model, seed)).get_trace(**data)
    except ModelError:
        raise
    except Exception as err:  # re-raise with the site being evaluated
        where = (
            f"after site {recorder.last_site!r} (while evaluating the code that follows it)"
            if recorder.last_site
            else "before its first site"
        )
        raise ModelError(
            f"{_name(model)}() raised {type(err).__name__} {where} when run with the data: {err}"
        ) from err


def _check_missing_observations(model: Callable, data: dict, model_trace: dict) -> None:
    try:
        params = inspect.signature(model).parameters
    except (TypeError, ValueError):
        return
    for name, site in model_trace.items():
        if site["type"] != "sample" or site["is_observed"]:
            continue
        p = params.get(name)
        if p is not None and p.default is None and data.get(name) is None:
            raise ModelError(
                f"site {name!r} is observed through the model argument {name!r}, but data has no "
                f"value for {name!r}, so the site would be sampled as a latent. Pass "
                f"data[{name!r}] = the observations. (To predict {name!r}, fit first and use "
                f"numpyro.infer.Predictive(model, result.sample(key, n)).)"
            )


def _plates(model_trace: dict) -> dict[str, PlateInfo]:
    plates = {}
    for name, site in model_trace.items():
        if site["type"] == "plate":
            size, subsample_size = site["args"][:2]
            plates[name] = PlateInfo(
                name=name,
                size=int(size),
                subsample_size=int(subsample_size if subsample_size is not None else size),
                dim=0,
            )
    # The dims are known only from the sites inside the plates.
    for site in model_trace.values():
        for frame in site.get("cond_indep_stack", []) or []:
            if frame.name in plates:
                p = plates[frame.name]
                plates[frame.name] = PlateInfo(p.name, p.size, p.subsample_size, int(frame.dim))
    return plates


def _variable(site: dict, plates: dict[str, PlateInfo]) -> VariableNode:
    fn = site["fn"]
    base = base_distribution(fn)
    frames = site.get("cond_indep_stack", []) or []
    site_plates = tuple(
        sorted((plates[f.name] for f in frames if f.name in plates), key=lambda p: p.dim)
    )
    return VariableNode(
        name=site["name"],
        observed=bool(site["is_observed"]),
        distribution=type(base).__name__,
        support=support_name(fn.support),
        shape=tuple(jnp.shape(site["value"])),
        batch_shape=tuple(fn.batch_shape),
        event_shape=tuple(fn.event_shape),
        plates=site_plates,
        discrete=bool(fn.support.is_discrete),
    )


def _check_observed_value(site: dict, var: VariableNode) -> None:
    value = site["value"]
    if var.distribution == "Unit":
        return
    expected = tuple(site["fn"].shape())
    if tuple(jnp.shape(value)) != expected:
        plates = ", ".join(str(p) for p in var.plates) or "none"
        raise ModelError(
            f"observed value of site {var.name!r} has shape {tuple(jnp.shape(value))} but its "
            f"distribution {var.distribution} has shape {expected} (batch {var.batch_shape}, "
            f"event {var.event_shape}; plates: {plates}). Give one observation per plate element "
            f"(check the data's length against the plate sizes)."
        )
    arr = np.asarray(value)
    if np.issubdtype(arr.dtype, np.floating) and not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))
        raise ModelError(
            f"observed value of site {var.name!r} has {len(bad)} non-finite entries (first at "
            f"index {tuple(int(i) for i in bad[0])}). Drop or impute them, or mask them with "
            f"numpyro.handlers.mask / obs_mask."
        )


def _site_fn_builder(model: Callable, data: dict, plate_values: dict) -> Callable:
    """``builder(site) -> site_fn``, where ``site_fn(values)`` re-runs the model.

    ``values`` holds latent and param values; subsampled plates use the
    indices of the traced run unless ``values`` overrides them by plate name.
    """

    def builder(name: str) -> Callable:
        def site_fn(values, with_scale: bool = False):
            substituted = {**plate_values, **values}
            with handlers.block():
                tr = handlers.trace(
                    handlers.substitute(handlers.seed(model, 0), data=substituted)
                ).get_trace(**data)
            site = tr[name]
            if with_scale:
                return site["fn"], site["value"], site.get("scale")
            return site["fn"], site["value"]

        return site_fn

    return builder


def _log_density(site_fn: Callable) -> Callable:
    def log_density(values):
        fn, value = site_fn(values)
        return fn.log_prob(value)

    return log_density


def _used_inputs(fn: Callable, values: dict) -> set[str]:
    """Names in ``values`` that ``fn``'s output depends on (jaxpr liveness)."""
    names = sorted(values)
    closed = jax.make_jaxpr(lambda *xs: fn(dict(zip(names, xs))))(*(values[n] for n in names))
    jaxpr = closed.jaxpr
    live = {id(v): v for v in jaxpr.outvars if _is_var(v)}
    for eqn in reversed(jaxpr.eqns):
        if any(id(o) in live for o in eqn.outvars):
            for v in eqn.invars:
                if _is_var(v):
                    live[id(v)] = v
    used = set()
    for name, var in zip(names, jaxpr.invars):
        if id(var) in live:
            used.add(name)
    return used


def _is_var(v) -> bool:
    return type(v).__name__ != "Literal"


def _name(model: Callable) -> str:
    return getattr(model, "__name__", "model")
