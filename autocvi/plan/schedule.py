"""The message-passing schedule autocvi generates for a classified FactorGraph.

:func:`plan` decides, from the graph's structure alone, for every latent node
its variational family and layout, for every incoming message its kind, the
update order, the subsampled plates and the default step size. It prints as a
table so that a user can see what autocvi will do before fitting.

Message kinds (CVI paper Alg. 2 and App. B.1, F):

* ``exact``: the factor is conjugate to the node; the message is the exact
  VMP message ``E_{q/i}[eta_{a,i}]`` (gradient of the exact expected log factor
  w.r.t. the node's mean parameters).
* ``monte-carlo``: Gaussian node, non-conjugate factor: Bonnet/Price
  estimates ``E[grad f]`` and ``E[hess f]/2`` from draws of q.
* ``fisher``: other continuous families, non-conjugate factor: the
  reparameterised gradient w.r.t. natural parameters, mapped to mean
  parameters by the inverse Fisher matrix (CVI App. F).
"""

from __future__ import annotations

import difflib
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax.extend import core as jax_core

from ..analysis.classify import classify_graph, latent_layouts, trace
from ..analysis.enumerated import describe_enumerated, find_enumerated
from ..analysis.expectations import Alignment, PointSet, alignment, expect, moment_point_set
from ..analysis.integrate import (
    find_integrations,
    integrate_conditionals,
    mean_field_hazards,
    residual_predictor,
)
from ..analysis.joint import (
    choose_start,
    describe_affine,
    find_joint_groups,
    joint_model,
    precondition_groups,
)
from ..analysis.layout import LatentLayout
from ..analysis.leaves import describe_leaves, find_leaves, hold_sites
from ..analysis.linear_predictor import find_linear_predictor, find_vector_predictor
from ..analysis.objectives import Objective, as_objective, expected_log_likelihood
from ..analysis.unrolled import PerformanceWarning, describe_unrolled, find_unrolled
from ..blocks.gaussian_block import find_block
from ..jaxpr import dce, structural_jit
from ..model.graph import EdgeInfo, FactorGraph, PlateInfo, _format_table
from ..model.message_kinds import (
    CUBATURE,
    EXACT,
    FISHER,
    GAUSS_HERMITE,
    MESSAGE_KINDS,
    MONTE_CARLO,
)
from ..model.trace import ModelError
from .site_memory import find_site_memory

__all__ = ["FactorPlan", "NodePlan", "Schedule", "plan", "build_schedule"]


@dataclass(frozen=True)
class FactorPlan:
    """One term of the log joint as the engine evaluates it."""

    name: str
    latents: tuple[str, ...]
    conjugate: dict[str, bool]
    alignments: dict[str, Alignment]
    log_density: Callable = field(repr=False)
    subsampled: tuple[PlateInfo, ...] = ()
    # latent -> LinearPredictor for non-conjugate Gaussian edges that see the
    # latent only through a scalar affine predictor per element (Gauss-Hermite).
    linear_predictors: dict = field(default_factory=dict, repr=False)
    # ``(rest, mean, var) -> reward per element`` over a linear predictor's marginals:
    # ``E[rest]`` (the ELBO's term), or the objective's (autocvi.analysis.objectives)
    # for a likelihood factor.
    expected: Callable = field(default=expected_log_likelihood, repr=False)
    # Whether ``expected`` reads the predictor's mean only (square-loss DLM).
    reward_reads_mean_only: bool = False
    # Whether ``expected``'s gradient is a sampling estimate (DLM's bMC, uPS).
    sampled_gradients: bool = False


@dataclass(frozen=True)
class NodePlan:
    """One latent node: its layout and incoming messages ``(factor, kind)``."""

    name: str
    layout: LatentLayout
    incoming: tuple[tuple[str, str], ...]
    # (axis, plate) for every subsampled plate the node lives in: the state
    # holds all N elements along ``axis``; a step updates the B sampled ones.
    subsample_axes: tuple[tuple[int, PlateInfo], ...] = ()

    @property
    def local(self) -> bool:
        return bool(self.subsample_axes)


@dataclass
class Schedule:
    """What autocvi will do with a model: nodes, messages, order, step size."""

    graph: FactorGraph
    nodes: dict[str, NodePlan]
    factors: dict[str, FactorPlan]
    order: tuple[str, ...]
    step_size: float
    num_samples: int
    params: dict = field(default_factory=dict, repr=False)
    # Gaussian nodes kept as prior + sites, with the solver chosen from structure
    # (autocvi.gaussian_block): node name -> GaussianBlock.
    blocks: dict = field(default_factory=dict, repr=False)
    # Step size of the blocks' site updates (each is safeguarded by an ELBO line
    # search, so a full step is the default).
    block_step_size: float = 1.0
    # Global nodes of a subsampled model use beta_t = step_size * (1 + t)^-decay
    # (Robbins-Monro, as stochastic VI, Hoffman et al. 2013); local nodes use step_size.
    step_size_decay: float = 0.0
    # Joint Gaussian groups (autocvi.analysis.joint): the nodes named after a group
    # hold one Gaussian over its members' unconstrained coordinates.
    joint: tuple = ()
    # Lines plan() prints about structure decisions (groups kept split, ...).
    notes: tuple = ()
    # The graph of the model as the user wrote it (``graph`` is the rewritten one
    # when there are joint groups).
    user_graph: FactorGraph | None = field(default=None, repr=False)
    # ``numpyro.param`` sites learned by variational EM (autocvi.infer.hyper); the
    # others keep the values they were traced with.
    learned: tuple = ()
    # Local latents integrated into their child's expectation
    # (autocvi.analysis.integrate): q(u) p(f | u), as SVGP; not nodes of the schedule.
    integrated: tuple = ()
    # Latents read by no factor but their own density (autocvi.analysis.leaves): held at
    # their prior conditional, out of the fit; ``fitted_model`` is the model without them
    # (None when there are none), the one q is fitted to and checked against.
    leaves: tuple = ()
    fitted_model: Callable | None = field(default=None, repr=False)
    # Messages from a subsampled factor to a global Gaussian held as per-element sites
    # (SiteMemory): their estimate's variance vanishes at the fixed point.
    site_memory: tuple = ()
    # Approximations the planner had to make that can leave the fit far from the
    # optimum (autocvi.analysis.integrate.mean_field_hazards): fit reports them as
    # FitWarnings and converged=False.
    hazards: tuple = ()
    # What the steps maximise (autocvi.analysis.objectives): the ELBO by default.
    objective: Objective = field(default_factory=as_objective, repr=False)

    def memory_of(self, node: str) -> dict:
        """``{factor: SiteMemory}`` for the messages to ``node`` held as per-element sites."""
        return {m.factor: m for m in self.site_memory if m.node == node}

    def step_size_at(self, iteration, local: bool = False, node: str | None = None):
        """beta at ``iteration`` (a traced integer) for a global or local node.

        A global node whose every estimated message from a subsampled factor is held
        in site memory keeps beta: its messages' variance vanishes at the fixed point,
        so Robbins-Monro decay would only slow it down."""
        if node is not None and not local:
            local = self._variance_reduced(node)
            held = [m for m in self.memory_of(node).values() if m.gradients]
            if held:
                # A memory of gradients (DLM rewards; SiteMemory.gradients) is filled by
                # plain minibatch steps in the first pass, which must decay; from then on
                # its estimates are variance-reduced (SAGA) and the step is held where
                # the first pass left it (a constant step reaches the fixed point).
                first_pass = max(-(-m.plate.size // m.plate.subsample_size) for m in held)
                iteration = jnp.minimum(iteration, first_pass)
        if local or self.step_size_decay == 0.0:
            return self.step_size
        return self.step_size * (1.0 + iteration) ** (-self.step_size_decay)

    def _variance_reduced(self, node: str) -> bool:
        held = self.memory_of(node)
        if any(m.gradients for m in held.values()):
            return False  # the first pass decays (step_size_at)
        return bool(held) and all(
            f in held or not self.factors[f].subsampled for f, _ in self.nodes[node].incoming
        )

    @property
    def deterministic(self) -> bool:
        """Every step is a fixed map: no subsampling and no Monte Carlo estimate.

        True when each factor has at most one non-conjugate neighbour and that
        neighbour gets a Gauss-Hermite message (a second non-conjugate
        neighbour would be sampled inside the expectation).
        """
        for f in self.factors.values():
            if f.subsampled:
                return False
            nonconj = [j for j in f.latents if not f.conjugate[j]]
            if len(nonconj) > 1 or (nonconj and nonconj[0] not in f.linear_predictors):
                return False
        return True

    @property
    def all_exact(self) -> bool:
        return all(kind == EXACT.name for n in self.nodes.values() for _, kind in n.incoming)

    def __str__(self) -> str:
        rows = []
        for pos, name in enumerate(self.order):
            node = self.nodes[name]
            msgs = "; ".join(f"{f} ({k})" for f, k in node.incoming)
            shape = "x".join(str(s) for s in node.layout.shape) or "scalar"
            if name in self.blocks:
                shape += f" [{self.blocks[name].describe()}]"
            if node.local:
                shape += " (local: " + ", ".join(str(p) for _, p in node.subsample_axes) + ")"
            rows.append((pos + 1, name, node.layout.family, shape, msgs))
        sub = sorted({str(p) for f in self.factors.values() for p in f.subsampled})
        kinds = sorted({k for n in self.nodes.values() for _, k in n.incoming})
        lines = [
            f"Schedule: {len(self.nodes)} nodes updated one after another in the order below, "
            f"every iteration (block coordinate ascent)",
            f"  step size beta = {self.step_size:g}"
            + (
                f" x (1 + t)^-{self.step_size_decay:g} for global nodes"
                if self.step_size_decay
                else ""
            )
            + (
                " (all messages exact: this is VMP)"
                if self.all_exact
                else " (damped: some messages are estimated)"
            )
            + (
                f"; Gaussian blocks: beta = {self.block_step_size:g}, halved by an ELBO line search"
                if self.blocks
                else ""
            ),
            f"  message kinds: {', '.join(kinds)}; Monte Carlo draws per estimate: {self.num_samples}",
            f"  objective: {self.objective.describe()}"
            + (
                ""
                if self.objective.is_elbo
                else " (likelihood sites: its gradient w.r.t. each predictor's mean parameters)"
            ),
            "  subsampled plates (factors scaled by N/B): " + (", ".join(sub) if sub else "none"),
            *(f"  {m.describe()}" for m in self.site_memory),
            "",
            _format_table(
                ("#", "node", "q family", "shape", "incoming messages (factor (kind))"), rows
            ),
        ]
        if self.joint:
            lines.append("")
            lines.append(
                "Joint Gaussian nodes (one Gaussian over the members' unconstrained coordinates):"
            )
            for g in self.joint:
                lines.append(f"  {g.name}: D = {g.dim}; because {g.reason}")
        if self.graph.params:
            lines.insert(
                4,
                "  numpyro.param sites learned by variational EM (CVI E-steps, M-steps on the "
                "bound with the prior moving): " + (", ".join(self.learned) or "none"),
            )
        for note in self.notes:
            lines.append(f"  note: {note}")
        for hazard in self.hazards:
            lines.append(f"  WARNING: {hazard}")
        return "\n".join(lines)


STRUCTURES = ("joint", "mean-field")

# The planner's options that plan(), autocvi.CVI and autocvi.fit pass through to
# build_schedule as keywords (``**planner_options``), with what each does.
PLANNER_OPTIONS = {
    "use_quadrature": "False replaces Gauss-Hermite messages by Monte Carlo ones (default True)",
    "step_size_decay": "beta_t = beta (1 + t)^-decay for global nodes (default 0.6 with "
    "subsampled plates, else 0)",
    "gaussian_blocks": "False keeps every Gaussian node as dense natural parameters instead "
    "of prior + sites (default True)",
    "learn_params": "False holds every numpyro.param site at its initial value instead of "
    "learning it by variational EM (default True)",
    "fixed_params": "names of numpyro.param sites held at their initial values while the "
    "others are learned (default none)",
    "site_memory": "False sends a global Gaussian the plain N/B-scaled minibatch message of a "
    "subsampled factor (t-SVGP's tied sites: O(m^2) memory, noise that needs decaying steps) "
    "instead of keeping one site per plate element (O(N) memory, exact at the fixed point; "
    "default True where the factor reads the node through a linear predictor)",
    "objective": "what CVI maximises: autocvi.ELBO() (default), autocvi.BetaELBO(beta) or "
    "autocvi.DLM(loss='log', beta=...) (direct loss minimisation)",
    "precondition": "False keeps every joint group in its members' unconstrained coordinates; "
    "default True: a group whose curvature at the start is too ill-conditioned for the working "
    "precision (an uncentred predictor) gets affine coordinates that whiten it (plan() says so)",
    "joint_sites": "names of continuous latents that join the joint Gaussian group of the "
    "latents their factors touch although every factor is conjugate to their own family (a "
    "Gamma precision and the effects it scales); fit() sets it itself when its coupling check "
    "finds mean-field too narrow at a small global latent (default none)",
    "integrate_conditionals": "True integrates every local Gaussian latent whose conditional is "
    "linear-Gaussian in global Gaussians into its one child's expectation (q(u) p(f | u), as "
    "SVGP); False never; default None: where the estimated loss is smaller than mean-field's",
}


# Options plan() decides itself before build_schedule (groups, integrations, coordinates):
# a re-plan from a cached trace (CVI with new data) keeps their decisions and drops them.
PLAN_ONLY_OPTIONS = ("integrate_conditionals", "precondition", "joint_sites")


def check_planner_options(options: dict, caller: str, extra=()) -> dict:
    """``options`` if every name is a planner option (or in ``extra``), else a TypeError
    naming the unknown ones and listing the valid ones."""
    valid = (*PLANNER_OPTIONS, *extra)
    unknown = [k for k in options if k not in valid]
    if unknown:
        hints = [
            f"{k!r} (did you mean {m[0]!r}?)"
            if (m := difflib.get_close_matches(k, valid, 1))
            else repr(k)
            for k in unknown
        ]
        raise TypeError(
            f"{caller}() got unknown planner option{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(hints)}; valid options: {', '.join(valid)}"
        )
    return dict(options)


def plan(
    model,
    data=None,
    *,
    num_samples: int | None = None,
    step_size: float | None = None,
    structure: str = "joint",
    init_strategy=None,
    **options,
) -> Schedule:
    """The message-passing schedule autocvi will run for ``model(**data)``.

    Args:
        model: a NumPyro model.
        data: keyword arguments for the model.
        num_samples: Monte Carlo draws per estimated message (default: 64 when a
            multivariate Gaussian node has Monte Carlo messages, else 16).
        step_size: override the default (1 when every message is exact, else 0.5).
        structure: ``"joint"`` (default): latents that a factor couples share
            one Gaussian over their unconstrained coordinates
            (:mod:`autocvi.analysis.joint`); ``"mean-field"``: one q per site.
        init_strategy: a NumPyro ``init_to_*`` strategy for where q starts
            (``init_to_median``, ``init_to_uniform``, ``init_to_value(values=...)``).
            Default: Gaussian nodes of exponential-family priors start at their
            prior, other sites at a prior draw (``init_to_uniform`` for sites
            without ``sample``, such as ``ImproperUniform`` flat priors), and
            joint groups at the centre of their unconstrained space.
        options: planner options (:data:`PLANNER_OPTIONS`: ``use_quadrature``,
            ``step_size_decay``, ``gaussian_blocks``; and ``rng_key``, the key of the
            numerical checks), passed to :func:`build_schedule`. An unknown name
            raises a ``TypeError`` listing the valid ones.
    """
    check_planner_options(options, "plan", extra=("rng_key",))
    if structure not in STRUCTURES:
        raise ValueError(f"structure must be one of {STRUCTURES}, got {structure!r}")
    integrate = options.pop("integrate_conditionals", None)
    precondition = options.pop("precondition", True)
    joint_sites = tuple(options.pop("joint_sites", ()))
    user_graph = graph = trace(model, data, init_strategy=init_strategy)
    # Told before anything is compiled: a Python loop of sites compiles for minutes.
    unrolled = find_unrolled(graph)
    if unrolled:
        warnings.warn(describe_unrolled(unrolled), PerformanceWarning, stacklevel=2)
    # Latents nothing else reads are held at their prior conditional, out of the fit.
    leaves = find_leaves(graph)
    fitted_model = None
    if leaves:
        held = hold_sites(model, {n: graph.example_values[n] for n in leaves})
        try:
            held_graph = trace(held, data, init_strategy=init_strategy)
        except ModelError:  # the model cannot run with them held: they keep a q
            held_graph = graph
        if set(leaves).isdisjoint(held_graph.latent_names):
            model, graph, fitted_model = held, held_graph, held
        else:
            leaves = ()
    fitted_graph = graph
    groups, notes = [], []
    if structure == "joint":
        groups, notes = find_joint_groups(graph, latent_layouts(graph), joint_sites=joint_sites)
    # Local Gaussian conditionals integrated into their child (q(u) p(f | u), as SVGP).
    integrations = find_integrations(graph, latent_layouts(graph), groups, integrate)
    if any(it.fires for it in integrations):
        graph = classify_graph(integrate_conditionals(graph, integrations))
        if structure == "joint":
            groups, notes = find_joint_groups(graph, latent_layouts(graph), joint_sites=joint_sites)
    leaf_notes = [describe_leaves(leaves)] if leaves else []
    notes = [*leaf_notes, *notes, *(it.describe() for it in integrations)]
    notes += [describe_unrolled(unrolled)] if unrolled else []
    enumerated = find_enumerated(user_graph)
    notes += [describe_enumerated(enumerated)] if enumerated else []
    fired = [it for it in integrations if it.fires]
    layouts = latent_layouts(fitted_graph)
    hazards = tuple(mean_field_hazards(fitted_graph, layouts, fired, groups))
    # The user's observed sites (a joint group's members become observed sites of the
    # rewritten model, but their densities are priors, not losses).
    options.setdefault("likelihoods", _likelihood_factors(fitted_graph))
    if not groups:
        schedule = build_schedule(graph, num_samples=num_samples, step_size=step_size, **options)
        schedule.notes = (*notes, *schedule.notes)
        schedule.integrated = tuple(it for it in integrations if it.fires)
        schedule.hazards = hazards
        if schedule.integrated or leaves:
            schedule.user_graph = user_graph
        schedule.leaves, schedule.fitted_model = leaves, fitted_model
        return schedule
    start = graph.example_values
    if init_strategy is None:  # the user's strategy is followed as given
        start, why = choose_start(model, data, graph, groups)
        notes = [
            *notes,
            f"joint groups start at {why}: the highest log density of 18 candidates (the "
            "prior median, its 15 prior draws, the centre of the unconstrained space, the "
            "traced prior draw)",
        ]
    # Preconditioned coordinates only where the group's node is not a Gaussian block:
    # a block factorises its prior and sites itself (robust to this conditioning), and
    # normalises its prior as a Gaussian over the node's coordinates, which already
    # counts the affine map's log-determinant.
    # The schedule comes first: the curvature check (a compiled Hessian per group) is
    # only paid for groups that did not become blocks.
    kwargs = {"num_samples": num_samples, "step_size": step_size, **options}
    schedule = _joint_schedule(model, data, groups, start, integrations, init_strategy, kwargs)
    free = [g for g in groups if g.name not in schedule.blocks] if precondition else []
    # (ELBO only: a minibatched log-loss DLM fit in float32 from the mode's whitened
    # coordinates had a non-finite objective at every iteration)
    minibatched = schedule.objective.is_elbo and any(
        f.subsampled for f in schedule.factors.values()
    )
    conditioned = {g.name: g for g in precondition_groups(model, data, free, start, minibatched)}
    chosen = [conditioned.get(g.name, g) for g in groups]
    if any(g.affine is not None for g in chosen):
        moved = dict(start)
        for g in chosen:
            if g.affine is not None:
                moved.update(g.values(jnp.zeros((g.dim,), jnp.result_type(g.affine.shift))))
        trial = _joint_schedule(model, data, chosen, moved, integrations, init_strategy, kwargs)
        if not any(g.affine is not None and g.name in trial.blocks for g in chosen):
            schedule, groups = trial, chosen
            notes = [*notes, *(describe_affine(g) for g in groups if g.affine is not None)]
    schedule.joint = tuple(groups)
    schedule.notes = (*notes, *schedule.notes)
    schedule.user_graph = user_graph
    schedule.integrated = tuple(it for it in integrations if it.fires)
    schedule.hazards = hazards
    schedule.leaves, schedule.fitted_model = leaves, fitted_model
    return schedule


def _joint_schedule(model, data, groups, start, integrations, init_strategy, kwargs) -> Schedule:
    """The schedule of ``model`` rewritten with ``groups`` (:func:`joint_model`)."""
    joint_graph = trace(joint_model(model, groups, start), data, init_strategy=init_strategy)
    if any(it.fires for it in integrations):
        joint_graph = classify_graph(integrate_conditionals(joint_graph, integrations))
    return build_schedule(joint_graph, **kwargs)


def build_schedule(
    graph: FactorGraph,
    *,
    num_samples: int | None = None,
    step_size: float | None = None,
    rng_key=None,
    use_quadrature: bool = True,
    step_size_decay: float | None = None,
    gaussian_blocks: bool = True,
    learn_params: bool = True,
    fixed_params=(),
    site_memory: bool = True,
    objective=None,
    likelihoods=None,
) -> Schedule:
    """Plan the schedule for an already classified graph (see :func:`plan`).

    ``use_quadrature=False`` replaces Gauss-Hermite messages by Monte Carlo ones.
    ``gaussian_blocks=False`` keeps every Gaussian node as dense natural
    parameters instead of prior + sites (a reference for tests).
    ``learn_params``/``fixed_params``: which ``numpyro.param`` sites are learned
    (``Schedule.learned``); a Gaussian node whose factors read a learned param is
    kept dense (a block's prior and predictors are fixed arrays).
    ``site_memory=False``: no per-element sites for subsampled factors (:class:`SiteMemory`).
    ``objective``: what the steps maximise (:mod:`autocvi.analysis.objectives`); a
    beta-ELBO scales every likelihood's log density by ``1 / beta``; a DLM objective
    gives each likelihood a Gauss-Hermite edge to its one Gaussian latent (refused
    by name where the likelihood reads it otherwise). ``likelihoods``: the names of
    the factors the objective treats as data terms (default: the graph's observed
    sites' densities).
    """
    objective = as_objective(objective)
    if likelihoods is None:
        likelihoods = _likelihood_factors(graph)
    layouts = latent_layouts(graph)
    values = graph.example_values
    params = {n: values[n] for n in graph.params}
    unknown = sorted(set(fixed_params) - set(graph.params))
    if unknown:
        raise ValueError(
            f"fixed_params names {unknown}, which are not numpyro.param sites of the model "
            f"(its params: {sorted(graph.params) or 'none'})"
        )
    # Integer and boolean params (counts, flags) have no gradient: they are held.
    held = set(fixed_params) | {
        n for n in graph.params if not jnp.issubdtype(jnp.result_type(values[n]), jnp.floating)
    }
    learned = tuple(n for n in graph.params if n not in held) if learn_params else ()
    block_notes = []
    example = {**values, **_plate_examples(graph)}
    factors: dict[str, FactorPlan] = {}
    oversize: set[tuple[str, str]] = set()
    new_edges: dict[tuple[str, str], EdgeInfo] = {}
    for fac in graph.factors.values():
        if not fac.latents:
            continue
        log_density = _compiled_log_density(graph.log_density_fn(fac.name), example, fac.name)
        likelihood = fac.name in likelihoods
        scale = objective.likelihood_scale if likelihood else None
        log_density = _scaled(log_density, scale)
        out = jax.eval_shape(log_density, example)
        factor_ndim = len(out.shape)
        aligns = {}
        conj = {}
        for latent in fac.latents:
            var = graph.variables[latent]
            aligns[latent] = alignment(
                layouts[latent], var.plates, len(var.batch_shape), fac.plates, factor_ndim
            )
            edge = graph.edges.get((fac.name, latent), EdgeInfo())
            conj[latent] = bool(edge.conjugate)
        _check_discrete(fac.name, layouts, aligns, conj)
        predictors = {}
        dlm = likelihood and not objective.expectation_of_log_density
        if dlm:
            # The reward is no expectation of the log density: no exact message.
            conj = {latent: False for latent in conj}
        if use_quadrature or dlm:
            for latent in fac.latents:
                lay = layouts[latent]
                # A whole-site Gaussian may become a Gaussian block, which never
                # forms the predictor's Jacobian; others are limited in size.
                block_candidate = (
                    gaussian_blocks and lay.q_family == "MultivariateNormal" and lay.plate_ndim == 0
                )
                too_big = math.prod(out.shape) * math.prod(lay.shape) > _MAX_PREDICTOR_JACOBIAN
                if too_big and not block_candidate:
                    continue
                lp = _gauss_hermite_predictor(log_density, example, latent, lay, conj[latent])
                if lp is None and not dlm:
                    lp = _vector_predictor(log_density, example, latent, lay, conj[latent])
                    if lp is not None and not _vector_rows_fit(out.shape, lp, lay):
                        lp = None
                if lp is not None and lp.vector_size is None and fac.name in graph.residuals:
                    lp = _with_residual(graph, fac.name, example, latent, out.shape, scale) or lp
                if lp is not None:
                    predictors[latent] = lp
                    if too_big:
                        oversize.add((fac.name, latent))
        if dlm:
            _check_dlm(fac, objective, layouts, predictors)
        factors[fac.name] = FactorPlan(
            name=fac.name,
            latents=fac.latents,
            conjugate=conj,
            alignments=aligns,
            log_density=log_density,
            subsampled=tuple(p for p in fac.plates if p.subsampled),
            linear_predictors=predictors,
            expected=_minibatch_reward(objective.expected, fac.plates)
            if dlm
            else expected_log_likelihood,
            reward_reads_mean_only=dlm and objective.reward_reads_mean_only,
            sampled_gradients=dlm and objective.sampled_gradients,
        )
    # Jacobians of unconstrained nodes are factors of their own (non-conjugate).
    for name, lay in layouts.items():
        if lay.transform is not None:
            var = graph.variables[name]
            factors[f"jacobian:{name}"] = _jacobian_factor(name, lay, var)

    # A conjugate verdict on an edge whose elements the factor couples would make the
    # shared moment nodes inexact: check it numerically and demote such edges.
    key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    for fname, fplan in list(factors.items()):
        for latent in fplan.latents:
            if (
                fplan.conjugate.get(latent)
                and layouts[latent].uniform_weights
                and not all(a is not None for a in fplan.alignments[latent].axes)
            ):
                key, sub = jax.random.split(key)
                if _couples_elements(fplan, latent, layouts, example, params, sub):
                    fplan.conjugate[latent] = False
                    new_edges[(fname, latent)] = EdgeInfo(
                        conjugate=False,
                        reason=(
                            f"the log density is affine in the statistics of {latent}, but "
                            f"{fname} couples several elements of {latent} that q treats as "
                            f"independent; declare {latent} as one vector site "
                            f"(.to_event(...)) to get a joint Gaussian and exact messages."
                        ),
                    )

    nodes = {}
    for name, lay in layouts.items():
        incoming = []
        for fname, fplan in factors.items():
            if name in fplan.latents:
                kind = _message_kind(lay, fplan.conjugate[name])
                if kind == MONTE_CARLO.name and name in fplan.linear_predictors:
                    vector = fplan.linear_predictors[name].vector_size is not None
                    kind = CUBATURE.name if vector else GAUSS_HERMITE.name
                incoming.append((fname, kind))
        var = graph.variables[name]
        sub_axes = tuple((len(var.batch_shape) + p.dim, p) for p in var.plates if p.subsampled)
        if len(sub_axes) > 1:
            raise NotImplementedError(
                f"latent site {name!r} is inside two subsampled plates "
                f"({', '.join(p.name for _, p in sub_axes)}); subsample at most one of them."
            )
        nodes[name] = NodePlan(name, lay, tuple(incoming), sub_axes)

    # Local nodes of subsampled plates first (stochastic VI order), then the
    # continuous globals, then discrete nodes: the globals' first update reads
    # the discrete nodes' random initial responsibilities (engine/init.py),
    # which breaks the symmetry of mixture components and topics; updating
    # responsibilities first from prior-draw components merged clusters.
    def rank(n):
        if nodes[n].local:
            return 0
        return 2 if layouts[n].discrete else 1

    order = tuple(sorted(layouts, key=rank))
    blocks = {}
    if gaussian_blocks:
        for name, node in nodes.items():
            reads = sorted(
                {p for f, _ in node.incoming for p in graph.factors[f].params if p in learned}
                if all(f in graph.factors for f, _ in node.incoming)
                else ()
            )
            block = find_block(node, factors, example, params)
            if block is not None and reads:
                block_notes.append(
                    f"{name} is kept as dense natural parameters, not a Gaussian block: its "
                    f"factors read the learned params {', '.join(reads)} (a block's prior and "
                    "predictors are fixed arrays)"
                )
                continue
            if block is not None:
                blocks[name] = block
                # Every likelihood term of a block gets Gauss-Hermite site messages.
                incoming = tuple(
                    (f, GAUSS_HERMITE.name if k == MONTE_CARLO.name else k)
                    for f, k in node.incoming
                )
                nodes[name] = NodePlan(node.name, node.layout, incoming, node.subsample_axes)
    # A mean-only reward's sites carry no precision: only a block's Newton step on the
    # mean solves it (a dense node's CVI step would crawl); refuse the others by name.
    for fname, fplan in factors.items():
        if fplan.reward_reads_mean_only and not set(fplan.latents) <= set(blocks):
            raise NotImplementedError(
                f"{objective.describe()}: the likelihood {fname!r} reads "
                f"{', '.join(repr(n) for n in fplan.latents)}, which is not a Gaussian block "
                "(a Gaussian latent whose factors touch it alone), and only a block solves "
                "the square loss; use DLM(loss='log') or autocvi.BetaELBO(beta) here."
            )
    # Predictors too large for the dense Gauss-Hermite message: Monte Carlo instead.
    for fname, latent in oversize:
        if latent not in blocks:
            del factors[fname].linear_predictors[latent]
            node = nodes[latent]
            incoming = tuple((f, MONTE_CARLO.name if f == fname else k) for f, k in node.incoming)
            nodes[latent] = NodePlan(node.name, node.layout, incoming, node.subsample_axes)
    edges = dict(new_edges)
    for name, node in nodes.items():
        for fname, kind in node.incoming:
            if fname in graph.factors:
                e = new_edges.get((fname, name)) or graph.edges.get((fname, name), EdgeInfo())
                edges[(fname, name)] = EdgeInfo(e.conjugate, e.reason, e.statistics, kind)
    graph = graph.with_edges(edges)
    if num_samples is None:
        num_samples = _default_num_samples(nodes, blocks)
    schedule = Schedule(graph, nodes, factors, order, 1.0, num_samples, params, blocks=blocks)
    schedule.learned = learned
    schedule.objective = objective
    schedule.notes = tuple(block_notes)
    schedule.step_size = _default_step_size(schedule) if step_size is None else step_size
    schedule.block_step_size = 1.0 if step_size is None else step_size
    if any(f.subsampled for f in factors.values()):
        schedule.step_size_decay = 0.6 if step_size_decay is None else step_size_decay
    elif step_size_decay is not None:
        schedule.step_size_decay = step_size_decay
    if site_memory:
        schedule.site_memory = find_site_memory(schedule, example)
    return schedule


# What JAX raises when the model turns a traced value into a concrete one: NumPy data
# indexed by a plate's traced subsample indices (``X[idx]`` with ``X`` a numpy array),
# ``int(...)``/``if`` on a latent.
_CONCRETE_VALUE_ERRORS = (
    jax.errors.TracerArrayConversionError,
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerBoolConversionError,
)


def _user_line(err: BaseException) -> str:
    """`` at file:line: code`` of the deepest frame of ``err`` outside autocvi, NumPyro
    and JAX (the user's model), or ``""``."""
    import os
    import traceback

    import jaxlib

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # autocvi/
    libraries = tuple(os.path.dirname(m.__file__) + os.sep for m in (jax, jaxlib, numpyro)) + (
        package + os.sep,
    )
    frames = [
        f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith(libraries)
    ]
    if not frames:
        return ""
    f = frames[-1]
    return f" at {f.filename}:{f.lineno}: {f.line}"


def _compiled_log_density(log_density: Callable, example: dict, factor: str = "") -> Callable:
    """The factor's log density as a dead-code-eliminated jaxpr.

    The model is traced once here (with numpyro's support checks off, since
    moment nodes may lie off the support, e.g. Dirichlet's pseudo-node, where
    the factor's affine formula is still the one to evaluate); the engine then
    replays only the equations the factor needs instead of re-running the whole
    model inside every message, which keeps compilation small (DESIGN.md sec. 5).
    """
    names = sorted(example)

    def flat_fn(*xs):
        with numpyro.validation_enabled(False):
            return log_density(dict(zip(names, xs)))

    try:
        closed = jax.make_jaxpr(flat_fn)(*(example[n] for n in names))
    except _CONCRETE_VALUE_ERRORS as err:
        hint = (
            " Most often the model indexes NumPy data with a subsampled plate's indices "
            "(X[idx] with X a numpy array): pass the data as JAX arrays (jnp.asarray(X)) "
            "or write numpyro.subsample(X, event_dim=1) inside the plate; or a numpy "
            "function is applied to a latent (use jax.numpy)."
            if isinstance(err, jax.errors.TracerArrayConversionError)
            else " autocvi evaluates the model's log density with the latents (and the "
            "subsample indices) as traced JAX values: keep int(), float() and Python "
            "if/while off them (jnp.where, lax.cond)."
        )
        raise ModelError(
            f"the model cannot be traced with its latents and subsample indices as JAX "
            f"values{_user_line(err)} (while evaluating the log density of "
            f"{factor or 'a factor'!r}): {type(err).__name__}: {str(err).splitlines()[0]}."
            f"{hint}"
        ) from err
    jaxpr, used = dce(closed.jaxpr)
    kept = [n for n, u in zip(names, used) if u]
    fn = jax_core.jaxpr_as_fun(jax_core.ClosedJaxpr(jaxpr, closed.consts))

    def evaluate(values):
        return fn(*(values[n] for n in kept))[0]

    return evaluate


def _likelihood_factors(graph: FactorGraph) -> frozenset:
    """The factors of the graph's observed sites: the data terms of an objective."""
    return frozenset(f.name for f in graph.factors.values() if f.kind == "likelihood")


def _scaled(log_density: Callable, scale: float | None) -> Callable:
    """``scale * log_density`` (the beta-ELBO's tempered likelihood), or itself for None."""
    if scale is None:
        return log_density
    # An array, not a Python float: the compiled step closes over it as an input
    # (autocvi.jaxpr.structural_jit), so every beta of a grid shares one program (1.0
    # included: x * 1.0 is x exactly, so BetaELBO(1) is still the ELBO to the last digit).
    factor = jnp.asarray(scale)
    return lambda values: factor * log_density(values)


def _minibatch_reward(expected, plates):
    """A DLM reward for a likelihood in subsampled plates: the log density the factor
    holds carries numpyro's minibatch scale ``N / B`` (an unbiased estimate of the
    full-data sum of log densities), but the reward ``log E_q[p(y_n | f_n)]`` is not
    linear in the log density, so the scale must multiply the reward, not the density:
    ``(N / B) sum_{n in batch} log E_q[p(y_n | f_n)]`` is the unbiased estimate of the
    full-data sum (Wei, Sheth & Khardon, *Direct Loss Minimization for Sparse Gaussian
    Processes*, Sec. 4: the objective is a sum over data, so minibatches estimate it)."""
    scale = math.prod(p.size / p.subsample_size for p in plates if p.subsampled)
    if scale == 1:
        return expected

    def reward(rest, mean, var, key=None):
        return scale * expected(lambda f: rest(f) / scale, mean, var, key)

    return reward


def _check_dlm(fac, objective, layouts: dict, predictors: dict):
    """A DLM objective needs each likelihood to read one Gaussian latent through a
    scalar linear predictor per observation (the reward ``log E_q[p(y_n | f_n)]`` is
    integrated over that predictor); anything else is refused by name."""
    gaussian = [n for n in fac.latents if layouts[n].q_family in ("Normal", "MultivariateNormal")]
    other = [n for n in fac.latents if n not in gaussian]
    if objective.reward_reads_mean_only and fac.distribution != "Normal":
        raise NotImplementedError(
            f"{objective.describe()}: the likelihood {fac.name!r} is {fac.distribution}; the "
            "square loss of the predictive mean is built for Normal likelihoods (the DLM "
            "paper's regression case), whose mean is the predictor itself. Use "
            "DLM(loss='log') for this likelihood."
        )
    if len(fac.latents) == 1 and fac.latents[0] in predictors:
        return
    if other:
        why = (
            f"it also reads {', '.join(repr(n) for n in other)}, whose q is not Gaussian "
            f"({', '.join(layouts[n].q_family for n in other)})"
        )
    elif len(fac.latents) > 1:
        why = (
            f"it reads several latents ({', '.join(repr(n) for n in fac.latents)}) that q "
            "keeps apart (declare them in one plate-free group, or use structure='joint')"
        )
    else:
        why = (
            f"it does not read {fac.latents[0]!r} through one scalar linear predictor per "
            "observation (or the latent is constrained)"
        )
    raise NotImplementedError(
        f"{objective.describe()}: the likelihood {fac.name!r} ({fac.distribution}) cannot "
        f"be handled: {why}. DLM integrates its loss (log E_q[p(y_n | f_n)], or the square "
        "error of its mean) over a one-dimensional Gaussian predictor f_n; use autocvi.ELBO() "
        "or autocvi.BetaELBO(beta) for this model."
    )


def _plate_examples(graph: FactorGraph) -> dict:
    """Example subsample indices for every subsampled plate (an input of the factors)."""
    out = {}
    for fac in graph.factors.values():
        for p in fac.plates:
            if p.subsampled:
                out[p.name] = jnp.arange(p.subsample_size)
    return out


# Largest Jacobian d eta / d z (elements) Gauss-Hermite messages may form.
_MAX_PREDICTOR_JACOBIAN = 50_000_000


def _gauss_hermite_predictor(log_density, example, latent, lay, conjugate):
    """A linear-predictor split of a non-conjugate factor for a Gaussian node, or None."""
    if (
        conjugate
        or lay.transform is not None
        or lay.q_family not in ("Normal", "MultivariateNormal")
    ):
        return None
    try:
        return find_linear_predictor(log_density, example, latent)
    except Exception:  # noqa: BLE001 - no split means the Monte Carlo message is used
        return None


def _vector_predictor(log_density, example, latent, lay, conjugate):
    """A K-vector linear-predictor split (one row of logits per element) for a whole-site
    multivariate Gaussian node, or None. Tried only where no scalar split exists, so the
    Gauss-Hermite path of scalar predictors is unchanged."""
    if (
        conjugate
        or lay.transform is not None
        or lay.q_family != "MultivariateNormal"
        or lay.plate_ndim != 0
    ):
        return None
    try:
        return find_vector_predictor(log_density, example, latent)
    except Exception:  # noqa: BLE001 - no split means the Monte Carlo message is used
        return None


def _vector_rows_fit(out_shape, lp, lay) -> bool:
    """Whether a K-vector split is worth its cubature message.

    At least two rows: a factor with one output element (a joint group's log|J|, a
    Dirichlet or MultivariateNormal prior, a GP's marginal likelihood in its kernel
    parameters) "splits" trivially, with the latent's own coordinates as the predictor,
    and the third-degree rule would then replace an unbiased Monte Carlo estimate of a
    strongly non-linear density by 2K points. And the predictor's Jacobian (N K x D)
    must be within what the dense messages form.
    """
    rows = math.prod(out_shape)
    return rows >= 2 and rows * lp.vector_size * math.prod(lay.shape) <= _MAX_PREDICTOR_JACOBIAN


def _with_residual(
    graph: FactorGraph, factor: str, example: dict, latent: str, shape, scale: float | None = None
):
    """The integrated child's predictor with its residual kept apart (one 1-D rule for
    the messages instead of an outer rule over an inner one), or None."""
    eps_key = graph.residuals[factor]
    dtype = jnp.result_type(example[latent])
    with_eps = {**example, eps_key: jnp.zeros(shape, dtype)}
    log_density = _scaled(
        _compiled_log_density(graph.log_density_fn(factor), with_eps, factor), scale
    )
    try:
        return residual_predictor(log_density, with_eps, latent, eps_key)
    except Exception:  # noqa: BLE001 - the integrated child's own predictor is kept
        return None


def _default_num_samples(nodes, blocks) -> int:
    """64 draws when a multivariate Gaussian node has Monte Carlo messages, else 16.

    Their Hessian estimates (Bonnet/Price) are D x D: with too few draws a
    21-dimensional joint GP node crawled and stalled 9 nats short. And the noise
    left in the means after iterate averaging scales as 1/sqrt(draws): a
    12-dimensional joint regression with a latent noise scale ended 0.13 NUTS sd
    off with 24 draws and 0.06 with 64 (the zoo's bar is 0.1)."""
    gaussian_mc = [
        name
        for name, node in nodes.items()
        if name not in blocks
        and node.layout.q_family == "MultivariateNormal"
        and any(kind == MONTE_CARLO.name for _, kind in node.incoming)
    ]
    return 64 if gaussian_mc else 16


def _default_step_size(schedule: Schedule) -> float:
    """beta = 1 for VMP; 0.1 with Fisher-route messages (their Monte Carlo
    estimates for Gamma/Beta/Dirichlet nodes are noisy, e.g. Poisson-gamma
    factorisation diverged at 0.5 and fits at 0.1); 0.5 otherwise.

    Gaussian blocks do not count: their site steps are safeguarded by an
    ELBO line search (GaussianBlock.update), so a full step (beta = 1, a
    Newton step on every predictor) is safe and fastest for them."""
    kinds = {
        kind
        for name, n in schedule.nodes.items()
        if name not in schedule.blocks
        for _, kind in n.incoming
    }
    return min((MESSAGE_KINDS[k].default_step for k in kinds), default=1.0)


def _message_kind(layout: LatentLayout, conjugate: bool) -> str:
    if conjugate:
        return EXACT.name
    if layout.q_family in ("Normal", "MultivariateNormal"):
        return MONTE_CARLO.name
    return FISHER.name


def _check_discrete(fname, layouts, aligns, conj):
    for latent, align in aligns.items():
        lay = layouts[latent]
        if lay.discrete and (not align.exact_for_discrete or not conj[latent]):
            raise NotImplementedError(
                f"factor {fname!r} depends on several elements of the discrete site {latent!r} "
                f"at once (it is not inside all of {latent!r}'s plates), so its closed-form "
                "message would need enumeration over all of them. Put the factor inside the "
                f"same plates as {latent!r}, or, where its elements depend on each other (a "
                "hidden Markov chain of states in a scan), sum them out of the model: the "
                "forward algorithm, a logsumexp recursion over the states in a scan, in a "
                "numpyro.factor."
            )


def _jacobian_factor(name: str, lay: LatentLayout, var) -> FactorPlan:
    transform = lay.transform

    def log_density(values):
        z = values[name]
        u = transform.inv(z)
        return transform.log_abs_det_jacobian(u, z)

    ndim = len(jax.eval_shape(lambda: log_density({name: jnp.ones(lay.shape)})).shape)
    plates = tuple(p for p in var.plates)
    align = alignment(lay, var.plates, len(var.batch_shape), plates, ndim)
    return FactorPlan(f"jacobian:{name}", (name,), {name: False}, {name: align}, log_density)


def _couples_elements(fplan: FactorPlan, latent, layouts, values, params, key) -> bool:
    """True when shared moment nodes give a different expectation than per-element ones.

    With a random per-element permutation of the node index the distribution of
    each element is unchanged, so the two expectations agree exactly when no
    term of the factor multiplies two elements of ``latent`` (DESIGN.md sec. 5).
    """
    lay = layouts[latent]
    fixed = {**params, **{k: v for k, v in values.items() if k != latent}}

    # One compiled program (a new closure per plan: structural_jit, not jax.jit):
    # op by op, each step compiled on its own (a second of a mixture's cold plan).
    @structural_jit(runs_once=True)
    def shared_and_mixed(key):
        mu = lay.fam.natural_to_mean(lay.reference_natural(key))
        shared = moment_point_set(lay, mu, fplan.alignments[latent])
        nodes, _ = lay.fam.moment_nodes(mu)
        p = nodes.shape[0]
        elem_shape = lay.family_shape[: lay.weight_ndim]
        u = jax.random.uniform(jax.random.fold_in(key, 1), (p,) + elem_shape)
        perm = jnp.argsort(u, axis=0)
        perm = perm.reshape(perm.shape + (1,) * (nodes.ndim - perm.ndim))
        shuffled = jnp.take_along_axis(nodes, jnp.broadcast_to(perm, nodes.shape), axis=0)
        mixed = PointSet(lay.to_site(shuffled), shared.weights)
        return (
            expect(fplan.log_density, {latent: shared}, fixed),
            expect(fplan.log_density, {latent: mixed}, fixed),
        )

    e1, e2 = shared_and_mixed(key)
    scale = 1.0 + abs(float(e1))
    return not bool(np.isfinite(float(e1))) or abs(float(e1) - float(e2)) > 1e-5 * scale
