"""Edge verdicts: is a factor's log density affine in the statistics of one latent?

Public entry points:

* :func:`analyse_function` -- a plain JAX function ``fn(values) -> array``;
* :func:`classify_edge` -- a numpyro factor given as ``site_fn(values) -> (dist, value)``.

Both return an :class:`EdgeVerdict`.
"""

from __future__ import annotations

import collections
import hashlib
import os
import weakref
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from ...jaxpr import dce
from . import algebra as A
from .algebra import CONST, IND, LOGW, LOGZ, Ctx, Mono, Opaque, Poly
from .interpreter import Interpreter, Val, eval_concrete

__all__ = ["EdgeVerdict", "FAMILIES", "FamilySpec", "analyse_function", "classify_edge"]


@dataclass(frozen=True)
class EdgeVerdict:
    """The conjugacy verdict of one (factor, latent) edge.

    Attributes:
        conjugate: the factor's log density is affine in the sufficient statistics
            of the latent's variational family (given the other latents).
        statistics: statistics of the latent found in the log density, e.g.
            ``("w", "w w^T")``, ``("log tau", "tau")``, ``("indicator(z)",)``.
        reason: one or two plain sentences saying why.
        param_forms: for each argument of the factor's distribution, how it
            depends on the latent (``""`` when it does not), e.g. ``"linear in w"``.
    """

    conjugate: bool
    statistics: tuple[str, ...]
    reason: str
    param_forms: dict[str, str] = field(default_factory=dict, hash=False)

    def __str__(self):
        word = "conjugate" if self.conjugate else "non-conjugate"
        return f"{word}: {self.reason}"


@dataclass(frozen=True)
class FamilySpec:
    name: str
    stats: tuple  # monomials spanning the family's sufficient statistics
    names: tuple  # their printed names, "{s}" stands for the site name
    support: str  # real | positive | unit | simplex | discrete | binary | unknown
    joint: bool = False  # cross-element products allowed (z z^T)


Z1, Z2, ZINV = Mono(zp=1.0), Mono(zp=2.0), Mono(zp=-1.0)

FAMILIES = {
    "Normal": FamilySpec("Normal", (Z1, Z2), ("{s}", "{s}^2"), "real"),
    "MultivariateNormal": FamilySpec(
        "MultivariateNormal", (Z1, Z2), ("{s}", "{s} {s}^T"), "real", joint=True
    ),
    "Gamma": FamilySpec("Gamma", (LOGZ, Z1), ("log {s}", "{s}"), "positive"),
    "InverseGamma": FamilySpec("InverseGamma", (LOGZ, ZINV), ("log {s}", "1/{s}"), "positive"),
    "Beta": FamilySpec("Beta", (LOGZ, LOGW), ("log {s}", "log(1-{s})"), "unit"),
    "Dirichlet": FamilySpec("Dirichlet", (LOGZ,), ("log {s}",), "simplex"),
    "Categorical": FamilySpec("Categorical", (IND,), ("indicator({s})",), "discrete"),
    "Bernoulli": FamilySpec("Bernoulli", (IND,), ("indicator({s})",), "binary"),
    "Unconstrained": FamilySpec("Unconstrained", (), (), "unknown"),
}


# ---------------------------------------------------------------------------
# tracing (cached)
# ---------------------------------------------------------------------------

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _dce(closed):
    jaxpr, _ = dce(closed.jaxpr, keep_inputs=True)
    return jaxpr, list(closed.consts)


def _unwrap(d):
    """Strip shape/mask wrappers (ExpandedDistribution, Independent, MaskedDistribution)."""
    import numpyro.distributions as dist

    wrappers = (dist.ExpandedDistribution, dist.Independent, dist.MaskedDistribution)
    while isinstance(d, wrappers):
        d = d.base_dist
    return d


def _param_names(base) -> list[str]:
    names = []
    attrs = vars(base)
    for n in type(base).arg_constraints:
        x = attrs.get(n)
        if x is None:
            continue
        if isinstance(x, (jax.Array, np.ndarray, float, int, np.number)):
            names.append(n)
    return names


def _make_site_fn(site_fn):
    names: list[str] = []

    def f(vals):
        d, value = site_fn(vals)
        base = _unwrap(d)
        names[:] = _param_names(base)
        return (d.log_prob(value),) + tuple(jnp.asarray(getattr(base, n)) for n in names)

    return f, names


def _trace(fn, values, kind: str):
    """Closed jaxpr of ``fn`` with every leaf of ``values`` an input (cached per fn)."""
    leaves, treedef = jax.tree_util.tree_flatten(values)
    leaves = [np.asarray(x) for x in leaves]
    key = (kind, treedef, tuple((x.shape, str(x.dtype)) for x in leaves))
    try:
        per_fn = _CACHE.setdefault(fn, {})
    except TypeError:  # not weak-referenceable
        per_fn = {}
    if key not in per_fn:
        if kind == "site":
            g, names = _make_site_fn(fn)
        else:

            def g(vals):
                return (jnp.asarray(fn(vals)),)

            names = []
        closed = jax.make_jaxpr(lambda *xs: g(jax.tree_util.tree_unflatten(treedef, xs)))(*leaves)
        jaxpr, consts = _dce(closed)
        per_fn[key] = (jaxpr, consts, list(names))
    return per_fn[key], leaves


def _target_position(values, target) -> int:
    paths, _ = jax.tree_util.tree_flatten_with_path(values)
    hits = [
        i for i, (path, _) in enumerate(paths) if path and getattr(path[0], "key", None) == target
    ]
    if len(hits) != 1:
        raise ValueError(
            f"target {target!r} must be a key of `values` holding a single array "
            f"(found {len(hits)} leaves)"
        )
    return hits[0]


# ---------------------------------------------------------------------------
# draws of the target
# ---------------------------------------------------------------------------


def _support(spec: FamilySpec, v: np.ndarray) -> str:
    if spec.support != "unknown":
        return spec.support
    if np.all(v > 0):
        return "positive"
    return "real"


def _draws(support: str, v: np.ndarray, dtype) -> list[np.ndarray]:
    """The example value plus deterministic valid draws spanning the support.

    Guards are resolved to the branch taken at *every* draw, so the draws cover
    both signs, both sides of 1/2 and the neighbourhood of the support's edges.
    """
    rng = np.random.default_rng(12345)
    v = np.asarray(v, dtype=np.float64)
    e = [rng.standard_normal(v.shape) for _ in range(6)]
    full = np.full(v.shape, 1.0)
    sign = np.where(e[5] >= 0, 1.0, -1.0)
    if support == "positive":
        ds = [np.exp(2 * e[0]), np.exp(-2 * e[0]), np.exp(4 * e[1]), np.exp(0.3 * e[2])]
        ds += [v * np.exp(3 * e[3]), np.exp(6 * e[4]), 1e-3 * full, 1e3 * full]
    elif support == "unit":
        lv = np.log(v) - np.log1p(-v)
        ds = [_sigmoid(x) for x in (2 * e[0], -2 * e[0], 4 * e[1], 0.3 * e[2], lv + 3 * e[3])]
        ds += [_sigmoid(7 * e[4]), 1e-3 * full, (1 - 1e-3) * full]
    elif support == "simplex":
        ds = [_softmax(x) for x in (2 * e[0], -2 * e[0], 4 * e[1], 0.3 * e[2])]
        ds += [_softmax(np.log(v) + 3 * e[3]), _softmax(8 * e[4]), _softmax(-8 * e[4])]
    else:
        ds = [3 * e[0], -3 * e[0], 30 * e[1], 0.3 * e[2], v + 10 * e[3], 1e3 * sign]
        ds += [1e3 * full, -1e3 * full]
    return [np.asarray(x, dtype=dtype) for x in [v] + ds]


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(x):
    x = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=-1, keepdims=True)


# ---------------------------------------------------------------------------
# analysis
# ---------------------------------------------------------------------------


@dataclass
class _Run:
    interp: Interpreter
    outs: list  # abstract values of the outputs
    vals: list  # output Vals (for concrete values)


def _run(entry, leaves, tpos, ctx, draws) -> _Run:
    jaxpr, consts, _ = entry
    it = Interpreter(ctx, draws)
    args = [Val(None, const=x) for x in leaves]
    args[tpos] = it.target_val(tuple(leaves[tpos].shape))
    vals = it.eval_jaxpr(jaxpr, consts, args)
    outs = [v.abs if v.dep else A.const_poly(ctx, v.const, np.shape(v.const)) for v in vals]
    return _Run(it, outs, vals)


def _self_check(ctx: Ctx, run: _Run) -> str:
    """Re-evaluate the derived polynomial at the draws; '' when it matches."""
    L = run.outs[0]
    if ctx.discrete or not isinstance(L, Poly) or not L.exact():
        return ""
    if any(m.cross or m.ind for m in L.terms):
        return ""
    v0 = run.vals[0]
    actual = v0.conc() if v0.dep else [np.asarray(v0.const)] * len(run.interp.draws)
    rtol = 1e-8 if np.dtype(ctx.cdtype) == np.float64 else 1e-3
    for d, z in enumerate(run.interp.draws):
        zf = np.asarray(z, dtype=np.float64).reshape(-1)
        pred = np.zeros(L.shape)
        mag = np.zeros(L.shape)
        for m, t in L.terms.items():
            c = np.asarray(t.c, dtype=np.float64)
            if m == CONST:
                val = c
            else:
                zz = zf[np.clip(t.idx, 0, None)] if t.idx is not None else zf[0]
                zz = np.where(c != 0, zz, 0.5)
                with np.errstate(all="ignore"):
                    val = np.where(c != 0, c * A.mono_eval(m, zz), 0.0)
            pred = pred + val
            with np.errstate(invalid="ignore"):
                mag = mag + np.abs(val)
        a = np.asarray(actual[d], dtype=np.float64)
        fa, fp = np.isfinite(a), np.isfinite(pred)
        nan = np.isnan(a)
        if np.any(~nan & (fa != fp)):
            return "finiteness"
        both = fa & fp
        with np.errstate(invalid="ignore"):
            bad = both & (np.abs(a - pred) > rtol * (1.0 + mag))
        if np.any(bad):
            return "value"
    return ""


def _analyse(entry, leaves, tpos, spec: FamilySpec, name: str):
    """Interpret the jaxpr for one target; returns (ctx, run, piecewise_note)."""
    v = np.asarray(leaves[tpos])
    discrete = spec.support in ("discrete", "binary")
    support = _support(spec, v) if not discrete else spec.support
    cdtype = np.float64 if jax.config.jax_enable_x64 else np.float32
    ctx = Ctx(
        name=name,
        family=spec.name,
        discrete=discrete,
        scalar=v.size == 1,
        positive=support in ("positive", "unit", "simplex"),
        unit=support in ("unit", "simplex"),
        cdtype=cdtype,
        # a MultivariateNormal node is one event row (last axis); leading axes are plates
        group=int(v.shape[-1]) if (spec.joint and v.ndim >= 1) else 1,
    )
    if discrete:
        return ctx, _run(entry, leaves, tpos, ctx, []), None
    draws = _draws(support, v, v.dtype)
    run = _run(entry, leaves, tpos, ctx, draws)
    L = run.outs[0]
    if isinstance(L, Opaque) and L.piecewise:
        # re-run with every guard resolved at one draw; accept if all pieces agree
        runs = [_run(entry, leaves, tpos, ctx, [d]) for d in draws]
        Ls = [r.outs[0] for r in runs]
        if any(isinstance(x, Opaque) for x in Ls):
            bad = next(r for r in runs if isinstance(r.outs[0], Opaque))
            return ctx, bad, None
        rtol = 1e-9 if cdtype == np.float64 else 1e-4
        if all(A.polys_equal(ctx, Ls[0], x, rtol) for x in Ls[1:]):
            for r in runs:
                if _self_check(ctx, r):
                    return ctx, run, None
            return ctx, runs[0], "piecewise"
        return ctx, run, None
    return ctx, run, None


def _names(spec: FamilySpec, s: str) -> tuple[str, ...]:
    return tuple(n.format(s=s) for n in spec.names)


def _site_label(site_name):
    return f"`{site_name}`" if site_name else "the factor"


def _judge(ctx: Ctx, spec: FamilySpec, run: _Run, site_name, params: dict) -> EdgeVerdict:
    s = ctx.name
    site = _site_label(site_name)
    L = run.outs[0]
    forms = {p: A.describe(ctx, a) for p, a in params.items()}
    stat_names = _names(spec, s)
    span = ", ".join(stat_names)
    dep_forms = [f"`{p}` is {f}" for p, f in forms.items() if f]
    hint = f" ({'; '.join(dep_forms)})" if dep_forms else ""

    if isinstance(L, Opaque):
        o = L.origin
        loc = None
        for p, a in params.items():
            if isinstance(a, Opaque) and a.origin is o:
                loc = f"in the `{p}` of {site}"
                break
        if loc is None:
            loc = f"in the log density of {site}{hint}"
        where = f" (at {o.source})" if o.source else ""
        if spec.name == "Unconstrained":
            tail = f"{s} has no exponential-family variational family (Unconstrained), so its factors are never conjugate."
        elif ctx.discrete:
            tail = f"the log density is not a function of indicator({s})."
        else:
            tail = f"the log density is not affine in ({span})."
        reason = f"{o.message}, {loc}{where}: {tail}"
        return EdgeVerdict(False, (A.describe(ctx, L),), reason, forms)

    monos = [m for m in L.terms if m != CONST] if isinstance(L, Poly) else []
    monos.sort(key=A._mono_order)
    found_names = tuple(A.mono_name(m, s, spec.name) for m in monos)

    if spec.name == "Unconstrained":
        contains = f" Its log density contains {', '.join(found_names)}." if found_names else ""
        reason = (
            f"`{s}` has a non-exponential-family prior and is fitted with a Gaussian on the "
            f"unconstrained space (family Unconstrained): its factors are never conjugate.{contains}"
        )
        return EdgeVerdict(False, found_names, reason, forms)

    if ctx.discrete:
        cross = [m for m in monos if m.cross]
        if cross:
            reason = (
                f"the log density of {site} depends jointly on several elements of {s} at once, "
                f"so it is not a sum of functions of single elements: not affine in the "
                f"per-element indicator({s})."
            )
            return EdgeVerdict(False, (f"indicator({s}) (across elements of {s})",), reason, forms)
        stats = (f"indicator({s})",) if monos else ()
        if monos:
            reason = (
                f"Every function of the discrete {s} is affine in its one-hot indicator, and the "
                f"log density of {site} is a sum of functions of single elements of {s}: "
                f"conjugate ({spec.name})."
            )
        else:
            reason = f"The log density of {site} does not depend on {s}: conjugate (constant)."
        return EdgeVerdict(True, stats, reason, forms)

    allowed = set(spec.stats)
    bad = [m for m in monos if m not in allowed]
    if bad:
        crosses = [m for m in bad if m.cross and m.is_polynomial() and m.zp == 2]
        if crosses and len(crosses) == len(bad) and spec.name == "Normal":
            reason = (
                f"the log density of {site} couples different elements of {s} "
                f"({s}_j {s}_k){hint}, outside the span of the elementwise Normal statistics "
                f"({span}); it is conjugate for a joint MultivariateNormal family."
            )
        elif crosses and len(crosses) == len(bad) and spec.joint:
            reason = (
                f"the log density of {site} couples different event rows of {s} "
                f"({s}_j {s}_k across rows){hint}, outside the span of the statistics "
                f"({span}) of each row's MultivariateNormal."
            )
        else:
            badn = ", ".join(A.mono_name(m, s, spec.name) for m in bad)
            reason = (
                f"the log density of {site} contains {badn}, outside the span of ({span}){hint}."
            )
        return EdgeVerdict(False, found_names, reason, forms)
    for m in monos:
        t = L.terms[m]
        if t.c is not None and not np.all(np.isfinite(t.c)):
            reason = (
                f"the coefficient of {A.mono_name(m, s, spec.name)} in the log density of {site} "
                f"is not finite at the example values: treated as non-conjugate."
            )
            return EdgeVerdict(False, found_names, reason, forms)
    check = _self_check(ctx, run)
    if check:
        reason = (
            f"internal check failed: the expression derived for the log density of {site} in "
            f"({span}) does not reproduce its values at draws of {s} ({check}); treated as "
            f"non-conjugate."
        )
        return EdgeVerdict(False, found_names, reason, forms)
    stats = tuple(n for m, n in zip(spec.stats, stat_names) if m in monos)
    if not stats:
        reason = f"The log density of {site} does not depend on {s}: conjugate (constant)."
    else:
        reason = (
            f"The log density of {site} is affine in ({', '.join(stats)}) given the other "
            f"latents, within the span of the {spec.name} statistics ({span}): conjugate."
        )
    return EdgeVerdict(True, stats, reason, forms)


def _check_discrete(spec, v, s):
    if spec.support not in ("discrete", "binary"):
        return None
    v = np.asarray(v)
    ok = np.all(v == np.round(v)) and np.all(v >= 0)
    if spec.support == "binary":
        ok = ok and np.all((v == 0) | (v == 1))
    if not ok:
        return EdgeVerdict(
            False,
            (),
            f"the example values of {s} are not valid {spec.name} values (integers"
            f"{' in {0, 1}' if spec.support == 'binary' else ' >= 0'}): {s} does not enter as a "
            f"discrete variable.",
            {},
        )
    return None


def _get_spec(family: str) -> FamilySpec:
    try:
        return FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown family {family!r}; expected one of {sorted(FAMILIES)}") from None


def _perturb(x: np.ndarray, rng) -> np.ndarray:
    """Another plausible value of a latent other than the target (support inferred from x)."""
    x = np.asarray(x)
    if x.dtype == bool:
        return ~x
    if np.issubdtype(x.dtype, np.integer):
        if np.all((x == 0) | (x == 1)):
            return (1 - x).astype(x.dtype)
        return np.roll(x.reshape(-1), 1).reshape(x.shape) if x.size > 1 else x
    xf = x.astype(np.float64)
    e = rng.standard_normal(x.shape)
    if np.all((xf == 0) | (xf == 1)) and xf.size > 1 and 0 < xf.mean() < 1:
        out = 1.0 - xf  # a float-coded binary latent
    elif xf.ndim >= 1 and np.all(xf > 0) and np.allclose(np.sum(xf, -1), 1.0, atol=1e-5):
        out = _softmax(np.log(xf) + 0.3 * e)
    elif np.all((xf > 0) & (xf < 1)):
        out = _sigmoid(np.log(xf) - np.log1p(-xf) + 0.3 * e)
    elif np.all(xf > 0):
        out = xf * np.exp(0.3 * e)
    else:
        out = xf + 0.3 * e * (np.abs(xf) + np.mean(np.abs(xf)) + 0.1)
    return out.astype(x.dtype)


def _other_values_verdict(entry, leaves, tpos, spec, target, site_name, first):
    """Re-judge a conjugate verdict at other values of the other latents.

    The coefficients (and resolved guards) depend on the other latents' example
    values; a monomial whose coefficient vanishes at the example (e.g. a discrete
    switch at 0 in ``s * w**3 + (1 - s) * w``) would otherwise go unnoticed.
    """
    if len(leaves) < 2:
        return first
    rng = np.random.default_rng(2024)
    others = [
        leaf if i == tpos else _perturb(np.asarray(leaf), rng) for i, leaf in enumerate(leaves)
    ]
    jaxpr, consts, names = entry
    try:
        base = np.asarray(eval_concrete(jaxpr, consts, leaves)[0])
        alt = np.asarray(eval_concrete(jaxpr, consts, others)[0])
    except Exception:  # pragma: no cover - an invalid perturbation
        return first
    if np.any(np.isnan(alt) & ~np.isnan(base)):
        return first  # the perturbed values left the other latents' support
    ctx, run, _ = _analyse(entry, others, tpos, spec, target)
    params = {n: run.outs[1 + i] for i, n in enumerate(names)}
    second = _judge(ctx, spec, run, site_name, params)
    if not second.conjugate:
        reason = second.reason.rstrip(".") + " (at other values of the other latents)."
        return EdgeVerdict(False, second.statistics, reason, first.param_forms)
    stats = tuple(
        n for n in _names(spec, target) if n in first.statistics or n in second.statistics
    )
    if stats == first.statistics:
        return first
    reason = (
        f"The log density of {_site_label(site_name)} is affine in ({', '.join(stats)}) given "
        f"the other latents, within the span of the {spec.name} statistics "
        f"({', '.join(_names(spec, target))}): conjugate."
    )
    return EdgeVerdict(True, stats, reason, first.param_forms)


# Verdicts by what determines them: the factor's jaxpr, its constants (the data) and the
# example values. A second plan of the same model and data (a refit, ``fit`` after ``plan``)
# reuses them: the abstract interpretation of a scan's body is most of a warm plan.
_VERDICTS: collections.OrderedDict = collections.OrderedDict()
_VERDICTS_KEPT = 512


def _digest(arrays) -> str | None:
    """A hash of the arrays' dtypes, shapes and bytes (None when one cannot be read)."""
    h = hashlib.blake2b(digest_size=16)
    for x in arrays:
        try:
            a = np.asarray(x)
        except Exception:  # noqa: BLE001 - e.g. typed PRNG keys: such a verdict is not kept
            return None
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _classify(entry, leaves, tpos, spec, target, site_name) -> EdgeVerdict:
    digest = _digest([*entry[1], *leaves])
    # the jaxpr's text by its hash: a large model's text is long, and 512 are kept
    text = hashlib.blake2b(str(entry[0]).encode(), digest_size=16).hexdigest()
    key = digest and (text, tuple(entry[2]), digest, tpos, spec.name, target, site_name)
    if key is not None and key in _VERDICTS:
        _VERDICTS.move_to_end(key)
        return _VERDICTS[key]
    verdict = _classify_uncached(entry, leaves, tpos, spec, target, site_name)
    if key is not None:
        _VERDICTS[key] = verdict
        if len(_VERDICTS) > _VERDICTS_KEPT:
            _VERDICTS.popitem(last=False)
    return verdict


def _classify_uncached(entry, leaves, tpos, spec, target, site_name) -> EdgeVerdict:
    bad = _check_discrete(spec, leaves[tpos], target)
    if bad is not None:
        return bad
    try:
        ctx, run, _ = _analyse(entry, leaves, tpos, spec, target)
        params = {n: run.outs[1 + i] for i, n in enumerate(entry[2])}
        verdict = _judge(ctx, spec, run, site_name, params)
        if verdict.conjugate:
            verdict = _other_values_verdict(entry, leaves, tpos, spec, target, site_name, verdict)
    except Exception as err:  # never guess "conjugate"
        if os.environ.get("AUTOCVI_CONJUGACY_DEBUG"):
            raise
        return EdgeVerdict(
            False,
            (),
            f"the conjugacy analysis of {_site_label(site_name)} in {target} failed "
            f"({type(err).__name__}: {err}); treated as non-conjugate.",
            {},
        )
    return verdict


def analyse_function(fn, values: dict, target: str, family: str, site_name=None) -> EdgeVerdict:
    """Conjugacy verdict for a plain JAX function ``fn(values) -> array`` (a log density).

    Args:
        fn: pure JAX function of a dict of latent values; returns the log density,
            any shape (one entry per plate element); data are closed over.
        values: concrete valid example values of every latent ``fn`` reads.
        target: the key of ``values`` being analysed.
        family: the target's variational family: ``"Normal"``, ``"MultivariateNormal"``,
            ``"Gamma"``, ``"Beta"``, ``"Dirichlet"``, ``"Categorical"``, ``"Bernoulli"`` or
            ``"Unconstrained"``.
        site_name: name used in the explanation (default: none, "the factor").
    """
    spec = _get_spec(family)
    tpos = _target_position(values, target)
    entry, leaves = _trace(fn, values, "fn")
    return _classify(entry, leaves, tpos, spec, target, site_name)


def classify_edge(site_fn, values: dict, target: str, family: str, site_name=None) -> EdgeVerdict:
    """Conjugacy verdict of a numpyro factor as a function of the latent ``target``.

    Args:
        site_fn: ``site_fn(values) -> (dist, value)``: the factor's numpyro distribution
            (possibly wrapped in ExpandedDistribution / Independent / MaskedDistribution;
            ``dist.Unit(log_factor)`` for ``numpyro.factor``) and the value it scores.
            The log density is ``dist.log_prob(value)``.
        values: concrete valid example values of every latent the factor touches.
        target: the latent being analysed (a key of ``values``).
        family: the target's variational family (see :func:`analyse_function`).
        site_name: the factor's site name, used in the explanation.

    Returns:
        :class:`EdgeVerdict`; ``param_forms`` describes every argument of the
        (unwrapped) distribution that is set, ``""`` when constant in ``target``.
    """
    spec = _get_spec(family)
    tpos = _target_position(values, target)
    entry, leaves = _trace(site_fn, values, "site")
    return _classify(entry, leaves, tpos, spec, target, site_name)
