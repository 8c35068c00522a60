"""Joint Gaussian groups: which latents share one Gaussian q, and the model that makes it so.

Mean-field *between* latents that a likelihood couples is what makes VI wrong
and unstable (DESIGN.md section 2): a logistic regression written with a
feature plate and a separate intercept oscillated and stopped 5-9 posterior sd
off. So q is chosen from what the factors couple, never from how the priors
are declared:

* a continuous latent is a *candidate* when it is in a Gaussian family
  (Normal / MultivariateNormal, or a Gaussian on its unconstrained space) or
  when some factor is not conjugate to it (a Gamma concentration of a negative
  binomial, say); an exponential-family latent whose every factor is
  conjugate (a Gamma precision, a Dirichlet) keeps its exact VMP updates, and
  discrete latents keep their closed-form messages, *except* a small global
  latent (no plates, at most ``MAX_HYPER_DIM`` values) in a factor that is not
  conjugate to another candidate: ``beta`` with ``alpha`` in
  ``Gamma(lam | alpha, beta)``, which the posterior correlates at 0.95;
* a group with no Gaussian member is formed only when all its members are such
  small globals: the plated Gamma factors of a Poisson-gamma factorisation keep
  their families and Fisher-route messages, as in the papers;
* two candidates belong to one group when a factor touches both and is either
  not conjugate to one of them (the small globals it touches join too), or
  conjugate to both as Gaussians (a shared Gaussian likelihood, or a
  hierarchical prior ``a ~ Normal(mu, 1)``);
* the elements of a candidate in a plate are coupled (and the site becomes a
  group of its own) when a factor outside that plate is not conjugate to it
  (``Bernoulli(logits=X @ w)`` with ``w`` declared in a feature plate).

A group becomes one latent vector ``z`` of the unconstrained coordinates of its
members (CVI paper Sec. 5: a Gaussian on the unconstrained space). The model is
rewritten, not the engine: :func:`joint_model` samples ``z`` from a flat
:class:`JointCoordinates` density and *conditions* each member site on its slice
of ``z`` (mapped to the member's support), so every member's prior becomes a
factor of ``z`` and the log-Jacobian of the maps is added as a factor. The
planner then sees one Gaussian node whose factors are its members' priors and
likelihoods, and chooses exact, Gauss-Hermite, Monte Carlo messages or a
Gaussian block for it as for any other node.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.distributions import MultivariateNormal, Normal, constraints
from numpyro.infer.util import log_density

from ..jaxpr import structural_jit
from ..model.coordinates import MEMBER_FLAG, JointCoordinates
from ..model.graph import FactorGraph
from ..model.trace import full_plates, prior_candidates
from .bijections import unconstraining_map
from .constrained import Constrained
from .layout import LatentLayout, Reshaped
from .precondition import (
    MAX_PRECONDITIONED_DIM,
    RESOLUTION_NEWTON_HALVINGS,
    RESOLUTION_NEWTON_STEPS,
    RESOLUTION_TOLERANCE,
    Affine,
    local_quadratic,
    mean_resolution,
    needs_preconditioning,
    newton_centre,
    newton_mode,
    resolution_checked,
    whitening_affine,
)

__all__ = [
    "JointCoordinates",
    "JointGroup",
    "find_joint_groups",
    "joint_model",
    "choose_start",
    "precondition_groups",
    "describe_affine",
    "MAX_JOINT_DIM",
]

# Largest joint group (unconstrained coordinates): above it the group is split
# back into one node per site and plan() says so.
MAX_JOINT_DIM = 2000
# Global latents of at most this many values may join a group as hyperparameters.
MAX_HYPER_DIM = 16


@dataclass(frozen=True)
class JointMember:
    """One site of a group: where its unconstrained coordinates sit in ``z``."""

    name: str
    shape: tuple[int, ...]  # the site's value shape
    unconstrained_shape: tuple[int, ...]
    offset: int
    transform: object  # unconstraining_map(support), None for real-valued sites

    @property
    def size(self) -> int:
        return math.prod(self.unconstrained_shape)

    def value(self, z):
        """The site's value from ``z`` (``(..., D)`` -> ``(...,) + shape``)."""
        lead = jnp.shape(z)[:-1]
        u = jnp.reshape(
            z[..., self.offset : self.offset + self.size], lead + self.unconstrained_shape
        )
        return u if self.transform is None else self.transform(u)


@dataclass(frozen=True)
class JointGroup:
    """Latent sites that share one Gaussian q over their unconstrained coordinates.

    The group's vector is ``z`` (the members' unconstrained coordinates, in order)
    or, when ``affine`` is set (:func:`precondition_groups`), ``zeta`` with
    ``z = affine.forward(zeta)``: q is a Gaussian over the group's vector either way.
    """

    name: str
    members: tuple[JointMember, ...]
    reason: str
    affine: Affine | None = None

    @property
    def dim(self) -> int:
        return sum(m.size for m in self.members)

    @property
    def member_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)

    def unconstrained(self, vector):
        """The members' unconstrained coordinates ``z`` from the group's vector."""
        return vector if self.affine is None else self.affine.forward(vector)

    def values(self, vector) -> dict:
        z = self.unconstrained(vector)
        return {m.name: m.value(z) for m in self.members}

    def coordinates(self, values: dict):
        """The group's vector for the members' ``values`` (the inverse of :meth:`values`)."""
        parts = []
        for m in self.members:
            v = jnp.asarray(values[m.name])
            u = v if m.transform is None else m.transform.inv(v)
            parts.append(jnp.reshape(u, (m.size,)))
        z = jnp.concatenate(parts) if parts else jnp.zeros((0,))
        return z if self.affine is None else self.affine.backward(z)

    def log_abs_det_jacobian(self, vector):
        """log |d members' values / d vector| (the members' bijections and the affine map)."""
        z = self.unconstrained(vector)
        total = 0.0 if self.affine is None else self.affine.log_abs_det
        lead = jnp.shape(z)[:-1]
        for m in self.members:
            if m.transform is None:
                continue
            u = jnp.reshape(z[..., m.offset : m.offset + m.size], lead + m.unconstrained_shape)
            ladj = m.transform.log_abs_det_jacobian(u, m.transform(u))
            extra = jnp.ndim(ladj) - len(lead)
            total = total + (
                jnp.sum(ladj, axis=tuple(range(len(lead), len(lead) + extra))) if extra else ladj
            )
        return total

    @property
    def has_jacobian(self) -> bool:
        """Whether the model needs a log-Jacobian factor for this group."""
        return self.affine is not None or any(m.transform is not None for m in self.members)


def find_joint_groups(
    graph: FactorGraph,
    layouts: dict[str, LatentLayout],
    max_dim: int = MAX_JOINT_DIM,
    joint_sites: tuple[str, ...] = (),
) -> tuple[list[JointGroup], list[str]]:
    """The joint groups of a classified graph (rules in the module docstring).

    ``joint_sites``: continuous latents to join the candidates their factors touch
    although every factor is conjugate to their own family (a Gamma precision that
    the posterior couples with the effects it scales; ``fit`` names them when its
    coupling check finds mean-field too narrow there): each factor that reads one
    links it with the other candidates it reads, as a non-conjugate factor would.

    Returns:
        ``(groups, notes)``: the groups with two or more members or one
        member whose plate elements are coupled, and one line per group that
        was too large and stays split (for ``plan()``).
    """
    check_joint_sites(graph, layouts, joint_sites)
    forced = set(joint_sites)
    candidates = []
    for name in graph.latent_names:
        lay = layouts[name]
        var = graph.variables[name]
        if lay.discrete or any(p.subsampled for p in var.plates):
            continue
        gaussian = lay.gaussian and lay.whitening is None
        nonconj = any(
            not graph.edges[(f.name, name)].conjugate
            for f in graph.factors.values()
            if name in f.latents and f.name != name
        )
        if gaussian or nonconj or name in forced:
            candidates.append(name)
    candidates += _coupled_hyperparameters(graph, layouts, set(candidates))
    cand = set(candidates)
    parent = {n: n for n in candidates}
    why: dict[str, list[str]] = {n: [] for n in candidates}

    def find(n):
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    coupled_elements = set()
    for fac in graph.factors.values():
        inside = [n for n in fac.latents if n in cand]
        if not inside:
            continue
        nonconj = [n for n in inside if not graph.edges[(fac.name, n)].conjugate or n in forced]
        gauss = [n for n in inside if graph.edges[(fac.name, n)].conjugate and layouts[n].gaussian]
        linked = set(nonconj)
        if nonconj or len(gauss) > 1:
            linked |= set(gauss)
        if nonconj:
            linked |= {n for n in inside if _small_global(graph, layouts, n)}
        linked = [n for n in inside if n in linked]
        for n in nonconj:
            fac_plates = {p.name for p in fac.plates}
            if any(p.name not in fac_plates for p in graph.variables[n].plates):
                coupled_elements.add(n)
                why[n].append(f"{fac.name} couples the elements of {n}")
        if len(linked) > 1:
            for n in linked[1:]:
                parent[find(n)] = find(linked[0])
            for n in linked:
                why[n].append(f"{fac.name} couples {', '.join(linked)}")
    roots: dict[str, list[str]] = {}
    for n in candidates:
        roots.setdefault(find(n), []).append(n)
    groups, notes = [], []
    for members in roots.values():
        if (
            not any(layouts[n].gaussian for n in members)
            and not (len(members) > 1 and all(_small_global(graph, layouts, n) for n in members))
            and not forced.intersection(members)
        ):
            # Only non-Gaussian exponential-family nodes (the Gamma factors of a
            # Poisson-gamma factorisation): they keep their own families and
            # Fisher-route messages (CVI App. F, J, K), as the papers do. A few
            # global hyperparameters (alpha and beta of Gamma(lam | alpha, beta))
            # do share one Gaussian: mean-field between them is what goes wrong. So
            # do the ones ``joint_sites`` names.
            continue
        if len(members) == 1 and members[0] not in coupled_elements:
            continue
        if len(members) == 1 and not graph.variables[members[0]].plates:
            continue  # one site without plates is one Gaussian already
        built, offset = [], 0
        for n in members:
            var = graph.variables[n]
            prior_support = graph.example_site(n)[0].support
            transform = (
                None if prior_support is constraints.real else unconstraining_map(prior_support)
            )
            if isinstance(prior_support, constraints.independent) and (
                prior_support.base_constraint is constraints.real
            ):
                transform = None
            ushape = (
                tuple(var.shape) if transform is None else tuple(transform.inverse_shape(var.shape))
            )
            built.append(JointMember(n, tuple(var.shape), ushape, offset, transform))
            offset += math.prod(ushape)
        reasons = sorted({r for n in members for r in why[n]})
        if offset > max_dim:
            notes.append(
                f"{', '.join(members)}: a joint Gaussian would have {offset} coordinates "
                f"(> {max_dim}); kept as one Gaussian per site (block-diagonal)."
            )
            continue
        groups.append(JointGroup("q(" + ",".join(members) + ")", tuple(built), "; ".join(reasons)))
    return groups, notes


def check_joint_sites(graph: FactorGraph, layouts: dict[str, LatentLayout], names) -> None:
    """A ``ValueError`` naming the site unless every name is a continuous latent."""
    for name in names:
        if name not in graph.latent_names:
            raise ValueError(
                f"joint_sites: {name!r} is not a latent site of the model; its latent "
                f"sites are {', '.join(graph.latent_names)}"
            )
        if layouts[name].discrete:
            raise ValueError(
                f"joint_sites: {name!r} is discrete; only continuous latents can share a "
                "joint Gaussian q"
            )


def _small_global(graph: FactorGraph, layouts: dict[str, LatentLayout], name: str) -> bool:
    """A continuous latent outside every plate with at most ``MAX_HYPER_DIM`` values."""
    var = graph.variables[name]
    return not layouts[name].discrete and not var.plates and math.prod(var.shape) <= MAX_HYPER_DIM


def _coupled_hyperparameters(
    graph: FactorGraph, layouts: dict[str, LatentLayout], candidates: set[str]
) -> list[str]:
    """Small global latents conjugate to all their factors that share a factor with a
    candidate not conjugate to it (``beta`` with ``alpha`` in ``Gamma(lam | alpha, beta)``).

    Each keeps its exact update when left alone, but q would then be mean-field
    between it and the non-conjugate latent, which the posterior couples through
    that factor: in a Gamma-Poisson hierarchy with 40 groups NUTS correlates alpha and
    beta at 0.94, and mean-field q had sds a quarter of NUTS's, reported as converged.
    """
    out = []
    for fac in graph.factors.values():
        if not any(
            n in candidates and not graph.edges[(fac.name, n)].conjugate for n in fac.latents
        ):
            continue
        for n in fac.latents:
            if n not in candidates and n not in out and _small_global(graph, layouts, n):
                out.append(n)
    return out


def choose_start(model, data: dict, graph: FactorGraph, groups: list[JointGroup]):
    """Where the joint groups' Gaussians start: ``(values, why)``.

    The candidate with the highest log density of the model among: NumPyro's
    ``init_to_median`` (the autoguides' default), the 15 prior draws that median
    is taken over, the centre of the unconstrained space (0: unit scales, zero
    locations) and the traced prior draw. No single rule is safe: the median of
    a wide prior can sit far out (a Weibull log-scale b0 ~ Normal(0, 10) started
    at -7.5 puts survival times at 1e3-1e4 scale units: log density -5e11, every
    step refused); the centre can be far from the data (a Poisson rate
    exp(log population + 0) overshoots the counts a thousandfold and drives a
    hierarchical scale into the neck of its funnel; a Weibull at scale 1 day
    against times of hundreds of days sends some Monte Carlo streams to a shape
    k -> 0 optimum 300 nats below the right one).
    """
    current = graph.example_values
    centre = dict(current)
    for g in groups:
        centre.update(g.values(jnp.zeros((g.dim,))))
    prior = prior_candidates(model, data)
    labelled = [("the prior median", v) for v in prior[:1]]
    labelled += [(f"prior draw {k} of the median's 15", v) for k, v in enumerate(prior[1:])]
    labelled += [("the centre", centre), ("the traced prior draw", current)]
    candidates = [{**current, **v} for _, v in labelled]
    # Judged on the whole data: with a subsampled plate the model's log density cannot
    # even be evaluated outside a seed handler, and every candidate scored NaN, so the
    # first (the prior median) won by default: a minibatched negative-binomial GLM
    # started at b0 = -3.7 (the median of 15 draws of Normal(0, 5)) and its first step
    # fell into the phi -> 0 optimum, 10,000 nats down, saying converged.
    model = full_plates(model)
    try:
        # numpy: jnp.stack outside a program compiles per site
        stacked = {n: np.stack([np.asarray(c[n]) for c in candidates]) for n in current}
        # One compiled program: evaluated op by op, every primitive of the model
        # compiled on its own (seconds of a cold plan).
        batched = structural_jit(
            jax.vmap(lambda v: log_density(model, (), data, v)[0]), runs_once=True
        )
        values = np.asarray(batched(stacked), dtype=float)
    except Exception:  # noqa: BLE001 - a model vmap cannot batch: one run per candidate
        values = np.array([_log_density_or_nan(model, data, c) for c in candidates])
    values = np.where(np.isfinite(values), values, -np.inf)
    best = int(np.argmax(values))
    return candidates[best], labelled[best][0]


def precondition_groups(
    model, data: dict, groups: list[JointGroup], start: dict, minibatched: bool = False
) -> list:
    """``groups``, each with affine coordinates (:mod:`autocvi.analysis.precondition`)
    when its curvature at ``start`` is too ill-conditioned for the working precision:
    centred on the log joint's mode (Newton steps), whitened there. The members'
    values at the new centre are ``group.values(zeros)``.

    ``minibatched``: the model has subsampled plates, and every group is centred and
    whitened so. A damped natural-gradient step from a start far from the data, its
    minibatch's messages scaled by N/B, overshoots (a minibatched negative-binomial GLM,
    N = 5,000, B = 250, set the coefficient of a rare binary covariate to 7.9 in its
    first step, 400 posterior sd out, where float32's exp overflowed and every later
    message was NaN); from the full data's mode the steps are corrections. The mode is
    found on the whole data (Newton steps, as for ill-conditioning).
    """
    out = []
    for g in groups:
        if g.affine is not None or g.dim < 2 or g.dim > MAX_PRECONDITIONED_DIM:
            out.append(g)
            continue
        z0 = g.coordinates(start)
        try:
            quadratic = local_quadratic(_group_log_joint(model, data, g, dict(start)))
            h = np.asarray(quadratic(z0)[2], np.float64)
        except Exception:  # noqa: BLE001 - a model jax cannot differentiate twice: as it was
            out.append(g)
            continue
        dtype = jnp.result_type(z0)
        needed, condition = needs_preconditioning(h, dtype)
        if not (needed or minibatched or resolution_checked(dtype)):
            out.append(g)
            continue
        resolution = None
        if needed or minibatched:
            centre, h = newton_centre(quadratic, z0)
        else:  # the resolution check: at the mode itself, if the steps settle there
            centre, h, settled = newton_mode(
                quadratic, z0, RESOLUTION_NEWTON_STEPS, RESOLUTION_NEWTON_HALVINGS
            )
            resolution = mean_resolution(h, centre, dtype) if settled else float("nan")
            if not resolution > RESOLUTION_TOLERANCE:
                out.append(g)
                continue
        if not np.all(np.isfinite(h)):  # no mode found: as it was
            out.append(g)
            continue
        affine = whitening_affine(h, centre, condition, needed, resolution)
        out.append(dataclasses.replace(g, affine=affine))
    return out


def describe_affine(group: JointGroup) -> str:
    """The ``plan()`` note of a preconditioned group."""
    if group.affine.resolution is not None:
        return (
            f"{group.name}: coordinates centred on the log joint's mode (Newton steps) and "
            "whitened there, z = c + P zeta with P^T H P = I: at this precision q's natural "
            f"parameter P m would hold its mean only to ~{group.affine.resolution:.2g} "
            "posterior sd (the data pin a sum of its coordinates far more tightly than the "
            "parts, far from 0)"
        )
    if not group.affine.ill_conditioned:
        return (
            f"{group.name}: coordinates centred on the log joint's mode on the whole data "
            "(Newton steps) and whitened there, z = c + P zeta with P^T H P = I: a "
            "minibatched fit starts near the data, where its N/B-scaled steps are "
            "corrections, not leaps"
        )
    return (
        f"{group.name}: coordinates preconditioned (the log joint's curvature at the start "
        f"has condition number {group.affine.condition:.1e}, beyond this precision): q is "
        f"a Gaussian over zeta with z = c + P zeta, c the log joint's mode (Newton steps), "
        f"P^T H P = I"
    )


def _group_log_joint(model, data: dict, group: JointGroup, fixed: dict):
    """The model's log joint as a function of ``group``'s vector, other latents ``fixed``."""

    def log_joint(vector):
        values = {**fixed, **group.values(vector)}
        density = log_density(full_plates(model), (), data, values)[0]
        return density + group.log_abs_det_jacobian(vector)

    return log_joint


def _log_density_or_nan(model, data, values) -> float:
    try:
        return float(log_density(model, (), data, values)[0])
    except Exception:  # noqa: BLE001 - a candidate the model rejects is not a start
        return float("nan")


def joint_model(model, groups: list[JointGroup], start: dict | None = None):
    """``model`` with every group's members conditioned on one flat vector site.

    The returned function has the model's signature. Each group's vector is
    sampled first, at zero unconstrained coordinates by default (the centre of
    the unconstrained space, as ``init_to_uniform`` without noise), or at the
    members' values in ``start`` (site -> value) when given; its
    members' sites are conditioned on their slices, so their prior densities
    stay in the model as factors of the vector, and the log-Jacobian of the maps
    to the members' supports is a ``numpyro.factor``.
    """

    @functools.wraps(model)
    def wrapped(*args, **kwargs):
        values = {}
        vectors = {}
        for g in groups:
            z0 = jnp.zeros((g.dim,)) if start is None else g.coordinates(start)
            z = numpyro.sample(g.name, JointCoordinates(z0))
            vectors[g.name] = z
            values.update(g.values(z))
        with handlers.condition(data=values), _MarkMembers(set(values)):
            out = model(*args, **kwargs)
        for g in groups:
            if g.has_jacobian:
                numpyro.factor(f"{g.name}:log|J|", g.log_abs_det_jacobian(vectors[g.name]))
        return out

    return wrapped


class _MarkMembers(numpyro.primitives.Messenger):
    """Marks the members' sites (``MEMBER_FLAG``): conditioned, but latents of the user's model."""

    def __init__(self, names):
        self.names = names
        super().__init__()

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] in self.names:
            msg["infer"] = {**(msg.get("infer") or {}), MEMBER_FLAG: True}


def member_posteriors(group: JointGroup, q_vector) -> dict:
    """Per-member numpyro Distributions from the joint q over the group's vector (its
    marginals over the members' values)."""
    if group.affine is not None:
        # q over z = c + P zeta: mean c + P m, covariance (P L)(P L)^T with L q's
        # Cholesky factor. The covariance over z can be beyond the precision's
        # range (that is why the group was preconditioned), so a member's factor
        # comes from a QR decomposition of its rows of P L, never a Cholesky of it.
        loc = group.affine.forward(q_vector.loc)
        factor = jnp.asarray(group.affine.matrix, loc.dtype) @ q_vector.scale_tril
        var, tril = jnp.sum(factor**2, axis=-1), {}
        for m in group.members:
            if m.unconstrained_shape:
                r = jnp.linalg.qr(factor[m.offset : m.offset + m.size].T, mode="r")
                tril[m.name] = r.T * jnp.where(jnp.diagonal(r) < 0, -1.0, 1.0)[None, :]
    elif hasattr(q_vector, "covariance_matrix"):
        loc, cov = q_vector.loc, q_vector.covariance_matrix
        var = jnp.diagonal(cov)
        tril = {
            m.name: jnp.linalg.cholesky(
                cov[m.offset : m.offset + m.size, m.offset : m.offset + m.size]
            )
            for m in group.members
            if m.unconstrained_shape
        }
    else:  # a structured block posterior: marginal variances only
        loc, var, tril = q_vector.mean, q_vector.variance, {}
    out = {}
    for m in group.members:
        sl = slice(m.offset, m.offset + m.size)
        if not m.unconstrained_shape:
            base = Normal(loc[m.offset], jnp.sqrt(var[m.offset]))
        elif m.name not in tril:
            base = Normal(loc[sl], jnp.sqrt(var[sl])).to_event(1)
        else:
            base = MultivariateNormal(loc[sl], scale_tril=tril[m.name])
        if m.unconstrained_shape and tuple(m.unconstrained_shape) != (m.size,):
            base = Reshaped(base, m.unconstrained_shape)
        out[m.name] = base if m.transform is None else Constrained(base, m.transform)
    return out
