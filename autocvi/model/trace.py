"""Turn a NumPyro model and its data into a :class:`~autocvi.graph.FactorGraph`.

The model is run once under NumPyro's ``seed`` and ``trace`` handlers to
record its sites and plates. The factors' dependencies on latent sites are
then read off one jaxpr of all the factors' log densities, by dead-code
elimination per factor (which enters ``jit``, ``scan``, ``cond`` and custom
derivative calls), so they see through ``numpyro.deterministic``,
``contrib.control_flow.scan`` and any JAX code between sites; the same pass
finds the ``numpyro.param`` sites a factor uses. No inference happens here.
"""

from __future__ import annotations

import difflib
import inspect
import os
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.distributions import Distribution, MaskedDistribution, constraints
from numpyro.infer.initialization import init_to_median, init_to_sample, init_to_uniform

from ..families.base import unwrap_distribution
from ..jaxpr import has_sub_jaxpr, interpret, structural_jit, used_inputs
from .coordinates import MEMBER_FLAG, JointCoordinates
from .graph import FactorGraph, FactorNode, ParamNode, PlateInfo, VariableNode

__all__ = [
    "trace_model",
    "prior_candidates",
    "ModelError",
    "base_distribution",
    "support_name",
    "full_plates",
]


class ModelError(ValueError):
    """The model or its data cannot be traced; the message names the site and the fix."""


class full_plates(numpyro.primitives.Messenger):  # noqa: N801 - a handler, as numpyro's
    """Runs a model with every subsampled plate at its full size (scale 1, all elements).

    Outside a ``seed`` handler a plate with ``subsample_size`` cannot draw its indices
    (numpyro raises "Missing random key to generate subsample indices"); inside one it
    draws a random batch. Where the planner judges values by the model's log density
    (the start of joint groups, their preconditioning) it wants the whole data's, so
    both are wrong: this handler makes the plate take all ``size`` elements, as the
    model does without ``subsample_size``.
    """

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["args"][1] is not None:
            size = msg["args"][0]
            msg["args"] = (size, None)
            msg["value"] = jnp.arange(size)


class _SiteRecorder(numpyro.primitives.Messenger):
    """Remembers the last site the model completed, to locate errors."""

    def __init__(self, fn=None):
        self.last_site: str | None = None
        super().__init__(fn)

    def postprocess_message(self, msg):
        if msg["type"] in ("sample", "param", "deterministic"):
            self.last_site = msg["name"]


class _ObservedAsArray(numpyro.primitives.Messenger):
    """Puts sites in the form the analysis expects.

    * Observed values given as lists, tuples or scalars become JAX arrays
      (NumPyro passes ``obs`` through unchanged, and a Python list breaks the
      distribution's ``log_prob`` once the parameters are traced).
    * A latent site masked by a constant array (``obs_mask`` creates
      ``<name>_unobserved`` masked to the missing entries) has elements that no
      density constrains; they get a standard-normal placeholder density
      (:class:`MaskedPlaceholder`), so q stays proper. Nothing else reads them,
      so at the optimum q is N(0, 1) there and adds exactly 0 to the ELBO.
    """

    def process_message(self, msg):
        if msg["type"] != "sample":
            return
        latent = not msg["is_observed"] or (msg.get("infer") or {}).get(MEMBER_FLAG, False)
        if latent:
            fn = msg["fn"]
            mask = getattr(fn, "_mask", None)
            # A mask that is the model's argument is traced inside the engine's programs
            # (data are their inputs): it gets the placeholder too, whatever its values
            # (where all are True the placeholder is the base density). Skipped there, the
            # masked-out elements had no density at all, and q's variance there grew
            # without bound (obs_mask=mask passed as data: ELBO +1,500, every step refused).
            if (
                isinstance(fn, MaskedDistribution)
                and isinstance(mask, (np.ndarray, jax.Array))
                and (isinstance(mask, jax.core.Tracer) or not bool(np.all(np.asarray(mask))))
            ):
                msg["fn"] = MaskedPlaceholder(fn.base_dist, jnp.asarray(mask))
        if msg["is_observed"]:
            value = msg["value"]
            if value is not None and not isinstance(value, (jax.Array, np.ndarray)):
                try:
                    msg["value"] = jnp.asarray(value)
                except (TypeError, ValueError) as err:
                    raise ModelError(
                        f"observed value of site {msg['name']!r} is a {type(value).__name__} "
                        f"that cannot be made into an array ({err}). Pass a numpy or JAX array."
                    ) from err


class MaskedPlaceholder(Distribution):
    """``base`` where ``mask`` is True, an independent N(0, 1) elsewhere (per batch element)."""

    arg_constraints = {}
    pytree_data_fields = ("base", "mask")

    def __init__(self, base, mask):
        self.base, self.mask = base, mask
        batch_shape = jnp.broadcast_shapes(base.batch_shape, jnp.shape(mask))
        super().__init__(batch_shape=batch_shape, event_shape=base.event_shape)

    @property
    def support(self):
        return self.base.support

    def sample(self, key, sample_shape=()):
        return self.base.expand(self.batch_shape).sample(key, sample_shape)

    def log_prob(self, value):
        event_axes = tuple(range(-len(self.event_shape), 0))
        placeholder = _standard_normal_log_density(value)
        if event_axes:
            placeholder = jnp.sum(placeholder, axis=event_axes)
        return jnp.where(self.mask, self.base.log_prob(value), placeholder)


class _InitialValues(numpyro.primitives.Messenger):
    """Gives every latent site its starting value by a NumPyro init strategy.

    ``init_strategy`` is one of NumPyro's ``init_to_*`` functions (or any
    ``f(site) -> value or None``). The default, ``init_to_sample``, is a prior
    draw; for distributions without ``sample`` (``ImproperUniform``, flat
    priors) it falls back to ``init_to_uniform``: a uniform draw on
    ``(-2, 2)`` of the unconstrained space, mapped to the support. Sites
    whose value is already set (by an inner ``substitute``: data, latent
    values) keep it.
    """

    def __init__(self, fn=None, init_strategy=None):
        self.init_strategy = init_strategy or init_to_sample
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] != "sample" or msg["is_observed"] or msg["value"] is not None:
            return
        if msg["fn"].support.is_discrete or isinstance(msg["fn"], JointCoordinates):
            return  # discrete sites are drawn; a joint group's start is set by its planner
        if self.init_strategy in _FALLBACK_STRATEGIES:
            value = _compiled_draw(self.init_strategy, msg)
        else:  # a user's strategy may have side effects: run as given
            value = self.init_strategy(msg)
        if value is not None:
            msg["value"] = value


def _compiled_draw(draw: Callable, msg: dict):
    """``draw(msg)`` (a pure function of the site's distribution and rng key) as one
    compiled program: run eagerly, each primitive of a sampler compiles on its own, and
    the Gamma and Dirichlet samplers' rejection loops take over a second each per shape.
    The distribution was built, and validated by NumPyro, eagerly in the model; only the
    draw is compiled. Falls back to the eager call for a distribution jit cannot take."""
    key = msg["kwargs"].get("rng_key")
    if key is None:
        return draw(msg)

    def compiled(fn, rng_key):
        return draw({**msg, "fn": fn, "kwargs": {**msg["kwargs"], "rng_key": rng_key}})

    try:
        return structural_jit(compiled, runs_once=True)(msg["fn"], key)
    except Exception:  # noqa: BLE001 - not a pytree, or a sampler jit cannot trace: eager
        return draw(msg)


def _standard_normal_log_density(value):
    return -0.5 * value * value - 0.5 * jnp.log(2.0 * jnp.pi)


def trace_model(
    model: Callable,
    data: Mapping[str, Any] | None = None,
    *,
    rng_key: jax.Array | int = 0,
    init_strategy: Callable | None = None,
) -> FactorGraph:
    """Trace ``model(**data)`` into the factor graph autocvi sees.

    Args:
        model: a NumPyro model function.
        data: keyword arguments for the model (the NumPyro idiom
            ``def model(X, y=None)``), observations included. Values that
            are not arrays (``N=10``, flags, lists) are passed through as is.
        rng_key: seed for the one model run that draws example latent values
            (and the indices of subsampled plates).
        init_strategy: how latent sites get example and starting values: one
            of NumPyro's ``init_to_sample`` (default), ``init_to_median``,
            ``init_to_uniform``, ``init_to_value(values=...)``. Distributions
            without ``sample`` (``ImproperUniform``) fall back to
            ``init_to_uniform`` under the sampling strategies.

    Returns:
        a :class:`FactorGraph` with one variable per sample site, one factor
        per site density and ``numpyro.factor``, params as hyperparameters.

    Raises:
        ModelError: the data do not fit the model (unknown or missing
            argument, missing observations, non-finite or out-of-support
            observations, shapes that disagree with the plates) or the model
            raised; the message names the site and says what to do.
    """
    data = dict(data or {})
    _check_arguments(model, data)
    seed = int(rng_key) if isinstance(rng_key, int) else rng_key
    model_trace, init_strategy = _run_model(model, data, seed, init_strategy)
    _check_missing_observations(model, data, model_trace)

    plate_sizes = _plate_sizes(model_trace)
    variables: dict[str, VariableNode] = {}
    params: dict[str, ParamNode] = {}
    site_nodes: dict[str, VariableNode] = {}
    example: dict[str, Any] = {}
    factor_sites = set()
    for name, site in model_trace.items():
        if site["type"] == "sample":
            var = _variable(site, plate_sizes)
            site_nodes[name] = var
            if _is_factor_site(site):
                # numpyro.factor is a sample site only by implementation: it is a
                # factor of the graph, not a variable.
                factor_sites.add(name)
                continue
            variables[name] = var
            if var.observed:
                _check_observed_value(site, var)
            else:
                example[name] = site["value"]
        elif site["type"] == "param":
            support = site["kwargs"].get("constraint", constraints.real)
            params[name] = ParamNode(
                name=name,
                shape=tuple(jnp.shape(site["value"])),
                constraint=support_name(support),
                support=support,
                data=bool(site["kwargs"].get("autocvi_data", False)),
            )
            example[name] = site["value"]
    plate_values = {
        name: site["value"]
        for name, site in model_trace.items()
        if site["type"] == "plate" and site["args"][1] is not None
    }

    builder = _site_fn_builder(model, data, plate_values, init_strategy)
    factor_names = [n for n in model_trace if n in site_nodes]
    used = _factor_dependencies(model, builder, factor_names, example)
    factors = {}
    for name in factor_names:
        var = site_nodes[name]
        if name in factor_sites:
            kind = "factor"
        else:
            kind = "likelihood" if var.observed else "prior"
        factors[name] = FactorNode(
            name=name,
            site=name,
            kind=kind,
            latents=tuple(n for n in example if n in used[name] and n in variables),
            params=tuple(n for n in example if n in used[name] and n in params),
            plates=var.plates,
            distribution="factor" if kind == "factor" else var.distribution,
        )
    graph = FactorGraph(
        variables=variables,
        factors=factors,
        params=params,
        _site_fn_builder=builder,
        _example_values=example,
        _example_trace=model_trace,  # the run that drew the example values
    )
    _check_improper_priors(graph)
    return graph


def _check_improper_priors(graph: FactorGraph) -> None:
    """A flat prior that no other factor informs makes the posterior improper."""
    for name, var in graph.variables.items():
        if var.observed or var.distribution != "ImproperUniform":
            continue
        if not [f for f in graph.factors_of(name) if f != name]:
            raise ModelError(
                f"site {name!r} has an improper prior (ImproperUniform) and no likelihood or "
                f"factor depends on it, so its posterior is improper too. Give it a proper "
                f"prior (e.g. dist.Normal(0, 10)), or use it in the model."
            )


# ---------------------------------------------------------------- helpers


def base_distribution(fn):
    """Strip numpyro's shape/mask wrappers (Expanded, Independent, Masked)."""
    return unwrap_distribution(fn)


def support_name(c) -> str:
    """A short readable name for a numpyro constraint."""
    if isinstance(c, constraints.independent):
        return f"{support_name(c.base_constraint)}^{c.reinterpreted_batch_ndims}"
    name = type(c).__name__.lstrip("_")
    for suffix in ("Constraint",):
        name = name.removesuffix(suffix)
    return name[:1].lower() + name[1:] if name else repr(c)


def _is_factor_site(site: dict) -> bool:
    return type(base_distribution(site["fn"])).__name__ == "Unit" and site["is_observed"]


def _check_arguments(model: Callable, data: dict) -> None:
    try:
        sig = inspect.signature(model)
    except (TypeError, ValueError):
        return
    params = sig.parameters
    positional_only = [n for n, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_ONLY]
    for key in data:
        if key in positional_only:
            raise ModelError(
                f"data has a key {key!r}, but {key!r} is a positional-only argument of "
                f"{_name(model)}(), which autocvi calls as {_name(model)}(**data). Make {key!r} "
                f"a keyword argument (drop the '/' from the signature)."
            )
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [
        n
        for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    for key in data:
        if key not in accepted:
            lower = {n.lower(): n for n in accepted}
            close = [lower[str(key).lower()]] if str(key).lower() in lower else []
            close = close or difflib.get_close_matches(str(key), accepted, n=1)
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


_PRIMITIVES = ("sample", "param", "deterministic", "factor", "_masked_observe")


def _failing_site(tb) -> str | None:
    """The name of the innermost numpyro site call on a traceback, if any."""
    name = None
    while tb is not None:
        frame = tb.tb_frame
        code = frame.f_code
        if code.co_name in _PRIMITIVES and code.co_filename.endswith(
            ("numpyro/primitives.py", "numpyro\\primitives.py")
        ):
            site = frame.f_locals.get("name")
            if isinstance(site, str):
                name = site
        tb = tb.tb_next
    return name


def _locate(err: BaseException, recorder: _SiteRecorder) -> str:
    """Where in the model ``err`` was raised, as a phrase naming a site."""
    site = _failing_site(err.__traceback__)
    if site is not None:
        return f"at site {site!r}"
    line = _user_line(err.__traceback__)
    if recorder.last_site is not None:
        return f"after site {recorder.last_site!r} (in the code that follows it{line})"
    return f"before its first site{line}"


# The packages whose frames are not the user's, by their install folders (a user's own
# project may well be called autocvi too).
_LIBRARIES = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (numpyro.__file__, jax.__file__, os.path.dirname(__file__))
)


def _user_line(tb) -> str:
    """``", at `<source>` (<file>:<line>)"``: the innermost frame of ``tb`` in the user's
    code (outside numpyro, JAX and autocvi), or ""."""
    frames = [f for f in traceback.extract_tb(tb) if not f.filename.startswith(_LIBRARIES)]
    if not frames or not frames[-1].line:
        return ""
    f = frames[-1]
    return f", at `{f.line.strip()}` ({os.path.basename(f.filename)}:{f.lineno})"


def _missing_none_arguments(model: Callable, data: dict) -> list[str]:
    try:
        params = inspect.signature(model).parameters
    except (TypeError, ValueError):
        return []
    return [n for n, p in params.items() if p.default is None and data.get(n) is None]


# Tried in turn when the user gives no init strategy: a prior draw of a heavy-tailed
# prior (HalfCauchy scales) can overflow the model (exp of a huge log-variance);
# the prior median, then NumPyro's own default, are tamer starts.
_FALLBACK_STRATEGIES = (init_to_sample, init_to_median(num_samples=15), init_to_uniform(radius=2))


# Why every start failed when a distribution's argument came out invalid, and the fixes.
_NO_VALID_START = (
    " At every start autocvi tried, the latents' values made that argument invalid: "
    "typically exp or softplus of a linear predictor overflowing, because a covariate is "
    "on a large scale (a raw year, income or price) against coefficients of scale 1. "
    "Centre and scale the covariates, or pass init_strategy=numpyro.infer.init_to_value("
    "values={...}) with values of the latents where the model runs."
)


def _run_model(model: Callable, data: dict, seed, init_strategy=None):
    """``(trace, strategy)``: one run of the model, and the init strategy that gave it.

    Without a user strategy, a run that raises or whose densities are not finite
    at the drawn values is retried with the next of ``_FALLBACK_STRATEGIES``.
    """
    strategies = (init_strategy,) if init_strategy is not None else _FALLBACK_STRATEGIES
    first_error = None
    for k, strategy in enumerate(strategies):
        recorder = _SiteRecorder()
        fn = _InitialValues(handlers.seed(_ObservedAsArray(model), seed), strategy)
        try:
            with recorder:
                model_trace = handlers.trace(fn).get_trace(**data)
        except ModelError:
            raise
        except Exception as err:  # noqa: BLE001 - retried, then re-raised naming the site
            first_error = first_error or (err, recorder)
            continue
        if k + 1 == len(strategies) or _densities_finite(model_trace):
            return model_trace, strategy
    err, recorder = first_error
    missing = _missing_none_arguments(model, data)
    hint = ""
    if missing:
        hint = (
            f" Note: data has no value for {', '.join(map(repr, missing))} (default None); "
            f"if the model needs it, add it to data."
        )
    if len(strategies) > 1:
        hint += " (The same happened from the prior median and from init_to_uniform.)"
        if isinstance(err, ValueError) and "invalid" in str(err):
            hint += _NO_VALID_START
    raise ModelError(
        f"{_name(model)}() raised {type(err).__name__} {_locate(err, recorder)} when run "
        f"with the data: {str(err) or '(the exception has no message)'}{hint}"
    ) from err


def prior_candidates(
    model: Callable, data: Mapping[str, Any] | None, rng_key=0, num_samples: int = 15
) -> list[dict]:
    """Candidate starting points from one run of the model: NumPyro's
    ``init_to_median(num_samples)`` (each latent at the elementwise median of
    ``num_samples`` prior draws, its parents held at their medians), then each of
    those ``num_samples`` draws (draw ``k`` of every site). [] when the model raises.
    """
    data = dict(data or {})
    seed = int(rng_key) if isinstance(rng_key, int) else rng_key
    draws: dict[str, Any] = {}

    def median_keeping_draws(site):
        if site["type"] != "sample" or site["is_observed"] or _is_factor_site(site):
            return None
        try:
            sample_shape = tuple(site["kwargs"].get("sample_shape") or ())
            shape = (num_samples, *sample_shape)
            samples = _compiled_draw(
                lambda s: s["fn"](rng_key=s["kwargs"].get("rng_key"), sample_shape=shape), site
            )
        except NotImplementedError:  # no sampler (ImproperUniform): NumPyro's fallback
            value = init_to_uniform(site)
            samples = jnp.broadcast_to(value, (num_samples, *jnp.shape(value)))
        draws[site["name"]] = samples = np.asarray(samples)
        # numpy, then back to a device array: jnp.median and indexing outside a program
        # compile one program each (0.15-0.3 s of a cold fit), and the values keep the
        # type the rest of the planner has always seen (a numpy scalar start changed
        # the float32 path of an ill-conditioned fit).
        median = np.median(samples, axis=0)
        median = _median_in_support(site["fn"].support, samples, median)
        floating = np.issubdtype(samples.dtype, np.floating)
        return jnp.asarray(median.astype(samples.dtype if floating else jnp.result_type(float)))

    try:
        model_trace, _ = _run_model(model, data, seed, median_keeping_draws)
    except ModelError:
        return []
    median = {
        name: site["value"]
        for name, site in model_trace.items()
        if site["type"] == "sample" and not site["is_observed"] and not _is_factor_site(site)
    }
    return [median] + [{n: jnp.asarray(v[k]) for n, v in draws.items()} for k in range(num_samples)]


def _median_in_support(support, samples: np.ndarray, median: np.ndarray) -> np.ndarray:
    """``median`` where it is in ``support``, else per batch element the draw nearest
    (L1) to it. A support that constrains whole events (a simplex, a correlation
    Cholesky factor) need not hold the elementwise median of its draws: the medians of
    15 ``Dirichlet(0.2)`` draws summed to 0.3, the model raised on them and no candidate
    was left at all. A draw is always in the support."""
    base = support
    while isinstance(base, constraints.independent):
        base = base.base_constraint
    event_dim = getattr(base, "event_dim", 0)
    if not event_dim or not np.issubdtype(samples.dtype, np.floating):
        return median  # elementwise supports hold their medians
    if bool(np.all(np.asarray(base.check(median.astype(samples.dtype))))):
        return median
    axes = tuple(range(samples.ndim - event_dim, samples.ndim))
    nearest = np.argmin(np.sum(np.abs(samples - median), axis=axes), axis=0)
    index = np.reshape(nearest, (1, *nearest.shape) + (1,) * event_dim)
    return np.take_along_axis(samples, index, axis=0)[0]


def _densities_finite(model_trace: dict) -> bool:
    """Every sample site's log density is finite at the traced values."""
    sites = [s for s in model_trace.values() if s["type"] == "sample" and s["value"] is not None]
    try:
        # numpyro distributions are pytrees: one compiled program for every site
        # (op by op, each primitive compiles on its own: seconds of a cold trace)
        pairs = [(s["fn"], s["value"]) for s in sites]
        return bool(_all_log_probs_finite(pairs))
    except Exception:  # noqa: BLE001 - a site jit cannot take: one site at a time
        pass
    for site in sites:
        try:
            lp = site["fn"].log_prob(site["value"])
        except Exception:  # noqa: BLE001 - not evaluable here: judged later, per factor
            continue
        if not bool(np.all(np.isfinite(np.asarray(lp)))):
            return False
    return True


@structural_jit(runs_once=True)
def _all_log_probs_finite(pairs):
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(d.log_prob(v))) for d, v in pairs]))


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


def _plate_sizes(model_trace: dict) -> dict[str, int]:
    """Full size N of every plate (a plate's dim and minibatch size are per site)."""
    return {
        name: int(site["args"][0]) for name, site in model_trace.items() if site["type"] == "plate"
    }


def _site_plates(site: dict, plate_sizes: dict[str, int]) -> tuple[PlateInfo, ...]:
    """The plates enclosing a site, outermost first, with the dims they use there.

    NumPyro's ``cond_indep_stack`` lists the innermost plate first. A plate's
    dim is taken from the site's own frame: the same plate name entered in two
    places (e.g. alone and inside another plate) may use different dims.
    """
    frames = site.get("cond_indep_stack", []) or []
    return tuple(
        PlateInfo(
            name=f.name,
            size=plate_sizes.get(f.name, int(f.size)),
            subsample_size=int(f.size),
            dim=int(f.dim),
        )
        for f in reversed(frames)
    )


def _variable(site: dict, plate_sizes: dict[str, int]) -> VariableNode:
    fn = site["fn"]
    base = base_distribution(fn)
    return VariableNode(
        name=site["name"],
        observed=bool(site["is_observed"]),
        distribution=type(base).__name__,
        support=support_name(fn.support),
        shape=tuple(jnp.shape(site["value"])),
        batch_shape=tuple(fn.batch_shape),
        event_shape=tuple(fn.event_shape),
        plates=_site_plates(site, plate_sizes),
        discrete=bool(fn.support.is_discrete),
    )


def _site_mask(fn) -> Any:
    """The site's mask (``handlers.mask`` / ``obs_mask``), or True when none."""
    mask = True
    while fn is not None:
        if type(fn).__name__ == "MaskedDistribution":
            mask = np.logical_and(mask, np.asarray(fn._mask))
        fn = getattr(fn, "base_dist", None)
    return mask


def _shape_hint(value_shape: tuple, var: VariableNode) -> str:
    """Why an observed value's shape disagrees with its site, and the fix."""
    event_ndim = len(var.event_shape)
    batch = value_shape[: len(value_shape) - event_ndim] if event_ndim else value_shape
    for p in var.plates:
        if -p.dim > len(batch):
            continue
        n = batch[p.dim]
        if n != p.subsample_size:
            if p.subsampled and n == p.size:
                return (
                    f"Plate {p.name!r} is subsampled ({p.subsample_size} of {p.size}): index the "
                    f"data with the plate's indices, `with numpyro.plate({p.name!r}, {p.size}, "
                    f"subsample_size={p.subsample_size}) as idx: ... obs=y[idx]`."
                )
            return (
                f"Dimension {p.dim} of the value has length {n} but plate {p.name!r} has size "
                f"{p.subsample_size}: give one observation per plate element (check the data's "
                f"length against the plate size, and the plate's dim)."
            )
    if not var.plates:
        return (
            f"The site is in no plate: wrap it in `with numpyro.plate('data', "
            f"{value_shape[0] if value_shape else 1}):` (one plate per independent dimension) "
            f"or give the distribution the value's shape with .expand(shape)."
        )
    return (
        "Give one observation per plate element: each plate must match one dimension of the "
        "value (its dim counts from the right, after the event dimensions); add the missing "
        "plates or reshape the data."
    )


def _in_support(fn, value):
    """``fn.support(value)``: by numpy where NumPyro's constraint evaluates a numpy value
    with numpy (the common ones do: no program to compile, 40-60 ms each of a cold
    trace), else as one compiled program when jit can take the distribution (eagerly,
    each of the constraint's primitives compiles on its own)."""
    try:
        inside = fn.support(np.asarray(value))
        if isinstance(inside, (np.ndarray, np.generic, bool)):
            return inside
    except Exception:  # noqa: BLE001 - a constraint that needs jnp: the compiled check
        pass
    try:
        return _support_check(fn, value)
    except Exception:  # noqa: BLE001 - not a pytree, or a constraint jit cannot trace
        return fn.support(value)


@structural_jit(runs_once=True)
def _support_check(fn, value):
    return fn.support(value)


def _check_observed_value(site: dict, var: VariableNode) -> None:
    value = site["value"]
    if var.distribution == "Unit":
        return
    fn = site["fn"]
    expected = tuple(fn.shape())
    shape = tuple(jnp.shape(value))
    plates = ", ".join(f"{p} at dim {p.dim}" for p in var.plates) or "none"
    if shape != expected:
        raise ModelError(
            f"observed value of site {var.name!r} has shape {shape} but its distribution "
            f"{var.distribution} has shape {expected} (batch {var.batch_shape}, event "
            f"{var.event_shape}; plates: {plates}). {_shape_hint(shape, var)}"
        )
    arr = np.asarray(value)
    event_ndim = len(var.event_shape)
    batch_shape = arr.shape[: arr.ndim - event_ndim]
    try:  # entries the model masks out (handlers.mask, obs_mask) may hold anything
        batch_mask = np.broadcast_to(np.asarray(_site_mask(fn), dtype=bool), batch_shape)
    except ValueError:
        batch_mask = np.ones(batch_shape, dtype=bool)
    if not batch_mask.any():
        return
    mask = np.broadcast_to(batch_mask.reshape(batch_shape + (1,) * event_ndim), arr.shape)
    if np.issubdtype(arr.dtype, np.inexact):
        bad = np.argwhere(~np.isfinite(arr) & mask)
        if len(bad):
            raise ModelError(
                f"observed value of site {var.name!r} has {len(bad)} non-finite entries (first "
                f"at index {tuple(int(i) for i in bad[0])}). Drop or impute them, or mask them "
                f"out: numpyro.sample({var.name!r}, ..., obs=y, obs_mask=jnp.isfinite(y)) or "
                f"`with numpyro.handlers.mask(mask=jnp.isfinite(y)):`."
            )
    try:
        inside = np.broadcast_to(np.asarray(_in_support(fn, value), dtype=bool), batch_shape)
    except Exception:  # a constraint without a check, or an odd shape: nothing to say
        return
    bad = np.argwhere(~inside & batch_mask)
    if len(bad):
        index = tuple(int(i) for i in bad[0])
        raise ModelError(
            f"observed value of site {var.name!r} has {len(bad)} entries outside the support "
            f"({support_name(fn.support)}) of its {var.distribution} distribution (first at "
            f"index {index}: {arr[index]}). Fix the data, or mask those entries out with "
            f"obs_mask / numpyro.handlers.mask."
        )


def _site_fn_builder(
    model: Callable, data: dict, plate_values: dict, init_strategy=None
) -> Callable:
    """``builder(site) -> site_fn``, where ``site_fn(values)`` re-runs the model.

    ``values`` holds latent and param values; subsampled plates use the
    indices of the traced run unless ``values`` overrides them by plate name.
    """

    def run(values, recorder: _SiteRecorder | None = None, rng_key=0):
        substituted = {**plate_values, **values}
        fn = _ObservedAsArray(model if recorder is None else recorder(model))
        # innermost, so that seeding and initial values skip the substituted sites
        fn = handlers.substitute(fn, data=substituted)
        fn = _InitialValues(handlers.seed(fn, rng_key), init_strategy)
        with handlers.block():
            return handlers.trace(fn).get_trace(**data)

    def builder(name: str) -> Callable:
        def site_fn(values, with_scale: bool = False):
            site = run(values)[name]
            if with_scale:
                return site["fn"], site["value"], site.get("scale")
            return site["fn"], site["value"]

        return site_fn

    builder.run = run
    return builder


def _factor_dependencies(
    model: Callable, builder: Callable, factor_names: list[str], values: dict
) -> dict[str, set[str]]:
    """For each factor, the names in ``values`` its log density depends on.

    One jaxpr computes every factor's log density from the latent and param
    values; dead-code elimination per output gives each factor's inputs.
    """
    names = list(values)

    def all_log_densities(*xs):
        tr = builder.run(dict(zip(names, xs)), recorder)
        return [tr[n]["fn"].log_prob(tr[n]["value"]) for n in factor_names]

    recorder = _SiteRecorder()
    try:
        closed = jax.make_jaxpr(all_log_densities)(*(values[n] for n in names))
    except ModelError:
        raise
    except Exception as err:
        raise ModelError(
            f"{_name(model)}() could not be traced with the latent values as JAX tracers: it "
            f"raised {type(err).__name__} {_locate(err, recorder)}: {err}. autocvi needs a model "
            f"that jax.jit could compile: no Python `if`/`while`/`int()`/`float()` on the value "
            f"of a latent site or param (use jnp.where, lax.cond or "
            f"numpyro.contrib.control_flow.scan), and no NumPy (np.*) calls on them (use jnp.*)."
        ) from err
    masks = _output_dependencies(closed.jaxpr)
    return {
        n: {name for i, name in enumerate(names) if masks[k] >> i & 1}
        for k, n in enumerate(factor_names)
    }


def _output_dependencies(jaxpr) -> list[int]:
    """For each output of ``jaxpr``, the inputs it depends on, as a bitmask.

    One forward walk (:func:`autocvi.jaxpr.interpret`), linear in the jaxpr's
    size. Calls are walked into; an equation with another sub-jaxpr (``scan``,
    ``cond``, ``while``) maps each output to the inputs JAX's dead-code
    elimination keeps for it; any other equation makes every output depend on
    every input.
    """

    def dependencies(eqn, ins: list[int]) -> list[int]:
        if has_sub_jaxpr(eqn):
            return [
                _union(d for d, used in zip(ins, used_inputs(eqn, k)) if used)
                for k in range(len(eqn.outvars))
            ]
        return [_union(ins)] * len(eqn.outvars)

    masks = [1 << i for i in range(len(jaxpr.invars))]
    consts = [None] * len(jaxpr.constvars)
    return interpret(jaxpr, consts, masks, dependencies, literal=lambda _: 0, const=lambda v, c: 0)


def _union(masks) -> int:
    out = 0
    for m in masks:
        out |= m
    return out


def _name(model: Callable) -> str:
    """The model's function name, seeing through functools.partial."""
    while not hasattr(model, "__name__") and hasattr(model, "func"):
        model = model.func
    return getattr(model, "__name__", "model")
