"""Local Gaussian conditionals integrated into their one child: q(u) p(f | u), as SVGP.

A sparse GP written with the exact SVGP conditional,

    u = sample("u", MultivariateNormal(0, Kuu))
    with plate("data", N):
        f = sample("f", Normal(A @ u, sqrt(k_ii - q_ii)))      # A = Kfu Kuu^-1
        sample("y", Bernoulli(logits=f), obs=y)

has a local Gaussian latent ``f`` whose conditional is linear-Gaussian in a
global Gaussian ``u`` and whose only child is one likelihood factor that reads
it element by element. SVGP (Hensman, Matthews & Ghahramani 2015, Eq. 4;
Chang, Khan & Solin, *Dual Parameterization of Sparse Variational Gaussian
Processes*, Eq. 5) takes ``q(u, f) = q(u) p(f | u)``: the conditional is not
fitted, so ``KL[q(u, f) || p(u, f)] = KL[q(u) || p(u)]`` and the likelihood is
scored under ``f_i = loc_i(u) + s_i eps_i``, ``eps_i ~ N(0, 1)``. The planner
rule here does that for any model of this shape: the factor graph loses the
latent ``f`` and its prior, and the child's density becomes

    g(u) = E_{p(f | u)}[log p(y | f)] = sum_k w_k log p(y | loc(u) + s x_k)

(a Gauss-Hermite rule in ``eps``, exact with the two nodes +-1 when the child
is conjugate to ``f``: its log density is then quadratic in ``f``; otherwise
the smallest of 8, 16 or 32 nodes that matches the 32-node rule at the traced
values with the residual scale tripled, since learned params move it). ``E_q(u)[g]``
is SVGP's expected log-likelihood, so the rest of the planner sees an ordinary
factor of ``u``: exact messages for a Gaussian likelihood (one step gives
Titsias's collapsed posterior), Gauss-Hermite messages on the predictor
``loc(u)`` otherwise, and ``u`` stays eligible for a Gaussian block.

When it fires. Fixing ``q(f | u) = p(f | u)`` is an approximation, and so is the
alternative, a q of its own for ``f`` mean-field with ``u``. Per element the
first loses about ``1/2 log(1 + s_i^2 c_i)`` nats (``c_i`` the child's curvature
in ``f_i``: what one observation would have taught ``f_i`` beyond ``u``), the
second about ``1/2 log(1 + v_i / s_i^2)`` (``v_i`` the prior variance of
``loc_i(u)``: the coupling mean-field drops). With ``integrate_conditionals=None``
(the default) the rule fires when the first estimate is the smaller, which is
the sparse-GP regime (small residual variance ``k_ii - q_ii``), and not for a
random-effects model whose group effects carry their own data; ``True`` /
``False`` force it. ``plan()`` prints the decision and both estimates.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import Distribution, Normal, constraints

from ..families.base import unwrap_distribution
from ..jaxpr import structural_jit
from ..model.graph import FactorGraph
from .expectations import GH_ORDER
from .layout import GAUSSIAN_Q_FAMILIES, LatentLayout
from .linear_predictor import LinearPredictor, find_linear_predictor

__all__ = [
    "Integration",
    "find_integrations",
    "mean_field_hazards",
    "integrate_conditionals",
    "residual_key",
    "residual_predictor",
]

# Prior draws of the global latents behind the estimate of loc(u)'s prior variance.
_PRIOR_DRAWS = 32
# Gauss-Hermite rules tried in the residual of a non-conjugate child, smallest first; the
# largest is the reference. The inner rule multiplies the child's cost (32 nodes made a
# banana SVGP's EM five times slower than 8).
INNER_RULES = (8, 16, 32)
# The residual scale is widened by this factor when a rule is checked: learned params
# move it (a banana SVGP's amplitude went from 1 to 3.4).
_SCALE_MARGIN = 3.0
# Estimated nats per element below which integrating is preferred to a joint Gaussian.
NEGLIGIBLE_GAP = 0.05
# A joint Gaussian larger than this costs more than integrating loses: its dense D x D
# step is cubic in the data (D = 662, an SVGP on 612 points with m = 50 learned inducing
# inputs, took 0.75 s per step against 2 ms integrated), so above it the rule decides as
# without a joint group (integrate when that loses less than mean-field).
LARGE_JOINT = 256
# Estimated nats per element that mean-field between a linear-Gaussian local latent and its
# Gaussian parents may lose before a fit that has to use it is reported as untrustworthy: a
# 10-class sparse GP (f given u with residual variance 0.11 of the prior's 1) estimated 1.1,
# and its mean-field fit collapsed q(u) and predicted at chance while saying converged.
MEAN_FIELD_HAZARD = 0.5


@dataclass(frozen=True)
class Integration:
    """A local latent integrated into its child's expectation (module docstring)."""

    latent: str  # f
    child: str  # the one factor besides its prior that reads f
    parents: tuple[str, ...]  # the global Gaussian latents of f's conditional mean
    num_nodes: int  # quadrature nodes in eps: 2 for a conjugate child, else of INNER_RULES
    gap_integrated: float  # estimated nats lost per element by q(f | u) = p(f | u)
    gap_mean_field: float  # estimated nats lost per element by q(u) q(f)
    fires: bool
    alternative: str = "a q of its own, mean-field"  # what f gets when the rule does not fire

    def describe(self) -> str:
        parents = ", ".join(self.parents)
        gaps = (
            f"estimated nats lost per element: {self.gap_integrated:.3g} integrated, "
            f"{self.gap_mean_field:.3g} mean-field"
        )
        if self.fires:
            return (
                f"{self.latent} is integrated into {self.child}'s expectation: "
                f"q({parents}) p({self.latent} | {parents}), as SVGP, with a "
                f"{self.num_nodes}-node rule in its residual ({gaps}; "
                f"integrate_conditionals=False gives {self.latent} {self.alternative})"
            )
        return (
            f"{self.latent} could be integrated into {self.child}'s expectation "
            f"(q({parents}) p({self.latent} | {parents}), as SVGP) but keeps "
            f"{self.alternative} ({gaps}; integrate_conditionals=True integrates it)"
        )


def find_integrations(
    graph: FactorGraph,
    layouts: dict[str, LatentLayout],
    joint_groups=(),
    option: bool | None = None,
) -> list[Integration]:
    """The latents of a classified graph that qualify (module docstring), with the decision.

    A latent ``f`` qualifies when: its q is an elementwise Normal on the real
    line inside at least one plate and its prior is a ``Normal``; its prior's
    other latents are Gaussian, outside ``f``'s plates, and conjugate (so the
    mean is affine in them and the scale reads none of them); exactly one other
    factor reads ``f``, with ``f``'s batch shape, each element reading only its
    own element of ``f``. ``option``: None decides by the estimated gaps (when
    ``joint_groups`` put ``f`` in a joint Gaussian of at most :data:`LARGE_JOINT`
    values, which contains both approximations but costs cubic time in ``f``'s
    size, only where the integrated gap is also below :data:`NEGLIGIBLE_GAP`),
    True / False force it.
    """
    if option is False:
        return []
    group_of = {m: g.name for g in joint_groups for m in g.member_names}
    group_dim = {m: g.dim for g in joint_groups for m in g.member_names}
    found = []
    for f in graph.latent_names:
        item = _qualifies(graph, layouts, f)
        if item is None:
            continue
        child, parents, conjugate_child = item
        gaps = _estimated_gaps(graph, f, child, parents)
        if gaps is None:
            continue
        gap_int, gap_mf = gaps
        group = group_of.get(f)
        if option:
            fires = True
        elif group is None or group_dim[f] > LARGE_JOINT:
            fires = gap_int < gap_mf
        else:
            # a joint Gaussian holds both approximations but costs O((m + N)^3): give
            # it up only where integrating loses next to nothing (the sparse-GP regime)
            fires = gap_int < gap_mf and gap_int <= NEGLIGIBLE_GAP
        num_nodes = 2 if conjugate_child else _inner_nodes(graph, f, child)
        alternative = f"the joint Gaussian {group}" if group else "a q of its own, mean-field"
        found.append(Integration(f, child, parents, num_nodes, gap_int, gap_mf, fires, alternative))
    return found


def mean_field_hazards(graph, layouts, integrations, joint_groups=()) -> list[str]:
    """Why a fit may be far off: local latents whose conditional is linear-Gaussian in
    global Gaussians (the SVGP shape) that are neither integrated nor in a joint group,
    because their child reads several of their elements per observation (a softmax over
    classes), where mean-field loses more than :data:`MEAN_FIELD_HAZARD` nats per element.

    Mean-field between f and u then pins q(u) to near-zero variance through the tight
    conditional, and coordinate ascent between the two barely moves while the stopping
    rule sees a flat ELBO. One line per latent, naming it, its child and the estimate.
    """
    handled = {it.latent for it in integrations} | {m for g in joint_groups for m in g.member_names}
    out = []
    for f in graph.latent_names:
        if f in handled:
            continue
        parents = _conditional_parents(graph, layouts, f, GAUSSIAN_Q_FAMILIES)
        if parents is None:
            continue
        others = [fac for fac in graph.factors.values() if f in fac.latents and fac.name != f]
        if len(others) != 1 or _reads_elementwise(graph, others[0].name, f):
            continue
        try:
            s2, v = _prior_spread(graph, f)
        except Exception:  # noqa: BLE001 - no estimate, no claim
            continue
        ok = np.isfinite(s2) & np.isfinite(v)
        if not np.any(ok):
            continue
        gap = float(np.mean(0.5 * np.log1p(v[ok] / s2[ok])))
        if gap > MEAN_FIELD_HAZARD:
            child = others[0]
            out.append(
                f"{f}'s conditional is linear-Gaussian in {', '.join(parents)} (the sparse-GP "
                f"shape), but {child.name!r} ({child.distribution}) reads several elements of "
                f"{f} per observation, so {f} is not integrated (q({', '.join(parents)}) "
                f"p({f} | {', '.join(parents)}) needs one element per observation) and keeps a "
                f"mean-field q, which loses an estimated {gap:.2g} nats per element: "
                f"q({', '.join(parents)}) collapses through the tight conditional and the fit "
                f"can stop far from the optimum. Write the model without {f} (the projection "
                f"{f} = A @ {parents[0]} as a deterministic), or fit it with SVI."
            )
    return out


def _prior_spread(graph: FactorGraph, f: str):
    """Per element of f: the conditional's variance ``s^2`` at the traced values and the
    variance ``v`` of its mean over prior draws of the parents."""
    values, _, prior_fn, shape = _pieces(graph, f, f)
    draw = graph.draw_latents

    @structural_jit(runs_once=True)
    def spread(keys):
        def one(key):
            return _loc_scale(prior_fn, {**values, **draw(key)}, shape)[0]

        return jax.vmap(one)(keys), _loc_scale(prior_fn, values, shape)[1]

    locs, scale = spread(jax.random.split(jax.random.PRNGKey(5), _PRIOR_DRAWS))
    s2 = np.maximum(np.asarray(scale, dtype=float) ** 2, 1e-300)
    return s2, np.var(np.asarray(locs, dtype=float), axis=0)


def _conditional_parents(graph, layouts, f, families=("Normal",)):
    """f's Gaussian parents when its prior is a Normal whose mean is affine in global
    Gaussian latents outside f's plates (the first half of :func:`_qualifies`), else None."""
    var = graph.variables[f]
    lay = layouts[f]
    if not var.plates or lay.q_family not in families or lay.transform is not None or var.discrete:
        return None
    prior, _ = graph.example_site(f)
    support = prior.support
    if isinstance(support, constraints.independent):
        support = support.base_constraint
    if type(unwrap_distribution(prior)) is not Normal or support is not constraints.real:
        return None
    own = graph.factors[f]
    parents = tuple(p for p in own.latents if p != f)
    if not parents:
        return None
    f_plates = {p.name for p in var.plates}
    for p in parents:
        pvar = graph.variables[p]
        if (
            not layouts[p].gaussian
            or layouts[p].transform is not None
            or not graph.edges[(f, p)].conjugate
            or any(pl.name in f_plates for pl in pvar.plates)
            or any(pl.subsampled for pl in pvar.plates)
        ):
            return None
    return parents


def _qualifies(graph, layouts, f):
    parents = _conditional_parents(graph, layouts, f)
    if parents is None:
        return None
    f_plates = {p.name for p in graph.variables[f].plates}
    others = [fac for fac in graph.factors.values() if f in fac.latents and fac.name != f]
    if len(others) != 1:
        return None
    child = others[0]
    if child.latents and any(
        lat != f and any(pl.name in f_plates for pl in graph.variables[lat].plates)
        for lat in child.latents
    ):
        return None  # another local latent of the same plates: not one 1-D expectation
    if not _reads_elementwise(graph, child.name, f):
        return None
    return child.name, parents, bool(graph.edges[(child.name, f)].conjugate)


def _pieces(graph: FactorGraph, f: str, child: str):
    """The traced values, the child's log density, f's prior and f's shape."""
    values = graph.example_values
    return values, graph.log_density_fn(child), graph.site_fn(f), tuple(jnp.shape(values[f]))


def _loc_scale(prior_fn, values, shape):
    """The conditional's mean and scale, broadcast to ``f``'s shape, at ``values``."""
    base = unwrap_distribution(prior_fn(values)[0])
    return jnp.broadcast_to(base.loc, shape), jnp.broadcast_to(base.scale, shape)


def _reads_elementwise(graph: FactorGraph, child: str, f: str) -> bool:
    """The child's log density has ``f``'s batch shape and element ``i`` reads only ``f_i``
    (two Jacobian-vector products: a diagonal Jacobian maps ``t * r`` to ``(J t) * r``)."""
    values = graph.example_values
    fn = graph.log_density_fn(child)
    x = jnp.asarray(values[f])
    out = jax.eval_shape(fn, values)
    if tuple(out.shape) != tuple(x.shape):
        return False
    r = np.random.RandomState(3).uniform(0.5, 1.5, x.shape).astype(x.dtype)

    @structural_jit(runs_once=True)
    def jvps(vals):
        def at(xf):
            return fn({**vals, f: xf})

        ones = jax.jvp(at, (vals[f],), (jnp.ones_like(vals[f]),))[1]
        scaled = jax.jvp(at, (vals[f],), (jnp.asarray(r),))[1]
        return ones, scaled

    ones, scaled = (np.asarray(a) for a in jvps(values))
    tol = 1e-5 * (1.0 + np.max(np.abs(ones * r)))
    return bool(np.all(np.isfinite(ones))) and bool(np.all(np.abs(ones * r - scaled) <= tol))


def _estimated_gaps(graph: FactorGraph, f: str, child: str, parents) -> tuple | None:
    """Per-element estimates of the nats each approximation loses (module docstring):
    the child's curvature at the traced values, the prior's scale there, and the
    variance of the prior's mean over prior draws of the parents."""
    values, fn, _, _ = _pieces(graph, f, child)

    @structural_jit(runs_once=True)
    def curvature(vals):
        def total(xf):
            return jnp.sum(fn({**vals, f: xf}))

        x = vals[f]
        return -jax.jvp(jax.grad(total), (x,), (jnp.ones_like(x),))[1]

    try:
        c = np.asarray(curvature(values), dtype=float)
        s2, v = _prior_spread(graph, f)
    except Exception:  # noqa: BLE001 - a model the estimate cannot run: no integration
        return None
    ok = np.isfinite(c) & np.isfinite(s2) & np.isfinite(v)
    if not np.any(ok):
        return None
    gap_int = 0.5 * np.log1p(s2[ok] * np.maximum(c[ok], 0.0))
    gap_mf = 0.5 * np.log1p(v[ok] / s2[ok])
    return float(np.mean(gap_int)), float(np.mean(gap_mf))


def _inner_nodes(graph: FactorGraph, f: str, child: str) -> int:
    """The smallest rule of :data:`INNER_RULES` whose expectation of the child, at the
    traced values with the residual scale widened by ``_SCALE_MARGIN``, matches the
    largest rule's to 1e-7 nats per element (1e-5 in float32)."""
    values, fn, prior_fn, shape = _pieces(graph, f, child)

    @structural_jit(runs_once=True)
    def expectations(vals):
        loc, scale = _loc_scale(prior_fn, vals, shape)
        scale = _SCALE_MARGIN * scale
        out = []
        for k in INNER_RULES:
            x, w = _rule(k, loc.dtype)
            nodes = loc[None] + scale[None] * jnp.reshape(x, (-1,) + (1,) * len(shape))
            per_node = jax.vmap(lambda fk: fn({**vals, f: fk}))(nodes)
            out.append(jnp.tensordot(w, per_node, axes=1))
        return out

    try:
        results = [np.asarray(r, dtype=float) for r in expectations(values)]
    except Exception:  # noqa: BLE001 - the reference rule then
        return INNER_RULES[-1]
    tol = 1e-7 if jnp.result_type(float) == jnp.float64 else 1e-5
    reference = results[-1]
    for k, r in zip(INNER_RULES[:-1], results[:-1]):
        if np.all(np.abs(r - reference) <= tol * (1.0 + np.abs(reference))):
            return k
    return INNER_RULES[-1]


class IntegratedChild(Distribution):
    """The child's density with ``f`` integrated out under ``p(f | u)`` by a quadrature rule.

    ``log_prob`` returns the precomputed ``sum_k w_k log p(y | loc(u) + s x_k)``
    whatever value it is given (the site's observed value); ``child`` is the
    child's distribution at ``f = loc(u)``, kept for support and shapes.
    """

    arg_constraints = {}

    def __init__(self, log_density, child):
        self._log_density = log_density
        self.child = child
        super().__init__(batch_shape=jnp.shape(log_density), validate_args=False)

    @property
    def support(self):
        return self.child.support

    def log_prob(self, value):
        return self._log_density

    def sample(self, key, sample_shape=()):
        return self.child.sample(key, sample_shape)


def _rule(num_nodes: int, dtype):
    """Gauss-Hermite nodes and weights for a standard normal (``num_nodes = 2``: +-1)."""
    x, w = np.polynomial.hermite_e.hermegauss(num_nodes)
    return jnp.asarray(x, dtype), jnp.asarray(w / np.sqrt(2.0 * np.pi), dtype)


def integrate_conditionals(graph: FactorGraph, integrations) -> FactorGraph:
    """``graph`` with every firing integration applied (unclassified edges of the children).

    The integrated latents and their priors leave the graph; each child's
    factor reads the parents instead, and its density is :class:`IntegratedChild`.
    Classify the result again (:func:`autocvi.analysis.classify.classify_graph`).
    """
    firing = [it for it in integrations if it.fires]
    if not firing:
        return graph
    builder = graph._site_fn_builder
    by_child = {it.child: it for it in firing}
    shapes = {it.latent: tuple(graph.variables[it.latent].shape) for it in firing}

    def new_builder(name: str):
        inner = builder(name)
        it = by_child.get(name)
        if it is None:
            return inner
        prior_fn = builder(it.latent)
        shape = shapes[it.latent]

        def site_fn(values, with_scale: bool = False):
            loc, scale = _loc_scale(prior_fn, values, shape)
            eps_key = residual_key(it.latent)
            if eps_key in values:  # f at one value of its residual: the child as written
                out = inner({**values, it.latent: loc + scale * values[eps_key]}, with_scale=True)
                return out if with_scale else out[:2]
            x, w = _rule(it.num_nodes, jnp.result_type(loc))
            nodes = loc[None] + scale[None] * jnp.reshape(x, (-1,) + (1,) * len(shape))

            def child_log_density(fk):
                d, value, sc = inner({**values, it.latent: fk}, with_scale=True)
                lp = d.log_prob(value)
                return lp if sc is None else lp * sc

            per_node = jax.vmap(child_log_density)(nodes)
            # a weighted sum over the node axis (mul and reduce_sum: the conjugacy
            # interpreter reads them as a sum of the children's statistics)
            lp = jnp.sum(jnp.reshape(w, (-1,) + (1,) * (per_node.ndim - 1)) * per_node, axis=0)
            d0, value = inner({**values, it.latent: loc})
            out = IntegratedChild(lp, d0)
            return (out, value, None) if with_scale else (out, value)

        return site_fn

    new_builder.run = builder.run
    drop = {it.latent for it in firing}
    variables = {n: v for n, v in graph.variables.items() if n not in drop}
    factors = {}
    for name, fac in graph.factors.items():
        if name in drop:
            continue
        it = by_child.get(name)
        if it is not None:
            latents = tuple(
                dict.fromkeys([*(n for n in fac.latents if n != it.latent), *it.parents]).keys()
            )
            params = tuple(dict.fromkeys([*fac.params, *graph.factors[it.latent].params]).keys())
            fac = replace(fac, latents=latents, params=params)
        factors[name] = fac
    edges = {
        k: e
        for k, e in graph.edges.items()
        if k[1] not in drop and k[0] not in drop and k[0] not in by_child
    }
    return replace(
        graph,
        variables=variables,
        factors=factors,
        edges=edges,
        residuals={**graph.residuals, **{it.child: residual_key(it.latent) for it in firing}},
        _site_fn_builder=new_builder,
        _example_trace=None,
    )


def residual_key(latent: str) -> str:
    """The values key of an integrated latent's standardised residual ``e``, ``f = loc +
    scale * e``: given it, the child's log density is the child's at that ``f`` (as the
    model wrote it) instead of its expectation over ``e``."""
    return f"{latent}:residual"


def residual_predictor(log_density, example: dict, target: str, eps_key: str):
    """A linear predictor of an integrated child for its Gaussian parent ``target`` that
    keeps the residual apart, or None.

    ``log_density`` is the child's, with the residual read from ``values[eps_key]``
    (:func:`residual_key`). Its predictor is ``eta = a^T u + b + s e`` (``s``
    per element: f's conditional scale, mapped through the child's affine part), so
    ``E_{q(u)} E_e[l(eta)] = E_{N(eta | a^T m + b, a^T S a + s^2)}[l(eta)]`` (a sum of
    independent Gaussians): the messages' 1-D rule over the total variance replaces
    the outer rule over an inner one (32 x 32 evaluations of the likelihood per element
    per message; ten times slower on an SVGP classifier's step).
    :class:`~autocvi.analysis.linear_predictor.LinearPredictor` ``point_fn`` and
    ``residual_var_fn`` carry it; its ``eta_fn``/``rest_fn`` are the integrated child's.
    """
    shape = tuple(jax.eval_shape(log_density, example).shape)
    dtype = jnp.result_type(example[target])
    zeros = jnp.zeros(shape, dtype)
    lp = find_linear_predictor(log_density, {**example, eps_key: zeros}, target)
    if lp is None:
        return None

    def eta_fn(values):
        return lp.eta_fn({**values, eps_key: zeros})

    def along(values, direction):
        return jax.jvp(lambda e: lp.eta_fn({**values, eps_key: e}), (zeros,), (direction,))[1]

    # eta must read e element by element (a diagonal d eta / d e), as f's conditional does.
    r = jnp.asarray(np.random.RandomState(5).uniform(0.5, 1.5, shape), dtype)
    ones_, scaled = along(example, jnp.ones(shape, dtype)), along(example, r)
    if not bool(jnp.all(jnp.abs(ones_ * r - scaled) <= 1e-5 * (1.0 + jnp.max(jnp.abs(scaled))))):
        return None

    target_zero = jnp.zeros_like(example[target])

    def residual_var(values):
        # s does not depend on the target (eta is affine in it): any value will do
        s = along({target: target_zero, **values}, jnp.ones(shape, dtype))
        return s * s

    def point_fn(eta, values):
        return lp.rest_fn(eta, {**values, eps_key: zeros})

    x, w = _rule(GH_ORDER, dtype)

    def rest_fn(eta, values):
        s = jnp.sqrt(residual_var(values))
        per_node = jax.vmap(lambda xk: point_fn(eta + s * xk, values))(x)
        return jnp.tensordot(w, per_node, axes=1)

    return LinearPredictor(eta_fn, rest_fn, point_fn, residual_var)


def integrated_marginal_note(integrations) -> list[str]:
    """plan()'s lines about the rule (one per qualifying latent)."""
    return [it.describe() for it in integrations]


def integrated_marginal(graph: FactorGraph, it: Integration, parents_q: dict, params: dict):
    """q's marginal of an integrated latent: ``f = loc(u) + s eps`` under ``q(u) p(f | u)``
    is Normal with mean ``loc(E u)`` and variance ``diag(J Cov(u) J^T) + s^2`` (``loc`` is
    affine in the parents). Parents are taken as independent in q (cross-covariances
    between two parents of one joint group are not in their marginals). None when a
    parent's q has no mean and (co)variance."""
    means, covs = {}, {}
    for p in it.parents:
        q = parents_q.get(p)
        try:
            means[p] = jnp.asarray(q.mean)
            covs[p] = jnp.asarray(
                q.covariance_matrix if hasattr(q, "covariance_matrix") else q.variance
            )
        except (AttributeError, NotImplementedError, TypeError):
            return None
    values = {**graph.example_values, **params}
    prior_fn = graph.site_fn(it.latent)
    shape = tuple(graph.variables[it.latent].shape)

    @structural_jit(runs_once=True)
    def moments(means, covs):
        def loc_scale(pv):
            return _loc_scale(prior_fn, {**values, **pv}, shape)

        loc, scale = loc_scale(means)
        var = jnp.ravel(scale**2)
        for p, m in means.items():

            def loc_of(x, p=p, m=m):
                return jnp.ravel(loc_scale({**means, p: jnp.reshape(x, jnp.shape(m))})[0])

            J = jax.jacfwd(loc_of)(jnp.ravel(m))
            cov = covs[p]
            if cov.ndim == 2 and cov.shape[0] == J.shape[1]:
                var = var + jnp.einsum("nd,de,ne->n", J, cov, J)
            else:
                var = var + (J**2) @ jnp.ravel(cov)
        return loc, jnp.reshape(jnp.sqrt(var), shape)

    loc, sd = moments(means, covs)
    return Normal(loc, sd)
