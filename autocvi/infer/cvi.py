"""``autocvi.CVI``: a NumPyro-native interface mirroring ``numpyro.infer.SVI``.

::

    cvi = autocvi.CVI(model)
    result = cvi.run(rng_key, 100, X, y=y)          # CVIRunResult(params, state, losses, ...)
    posterior = cvi.get_posterior(result.state)     # site -> numpyro Distribution
    guide = cvi.guide(result.state)                 # for numpyro.infer.Predictive

    state = cvi.init(rng_key, X, y=y)               # or step by step
    for _ in range(100):
        state, elbo = cvi.update(state, X, y=y)

Model arguments are passed as to ``SVI``: positional arguments are bound to the
model's signature. Conventions follow NumPyro: ``losses`` are negative ELBOs
(``update`` and ``evaluate`` return the ELBO itself, as ``fit`` reports it).
Planning, the step and the stopping rule are ``fit``'s (``autocvi.plan`` with
the same ``structure``; ``fit``'s compiled chunk runner and health checks), so
``CVI(model).run(key, n, **data)`` and ``fit(model, data)`` give the same q.

Data as inputs. The model is traced and planned once per shape of its array
arguments: every array argument (ndim >= 1) enters the trace as a hidden
``numpyro.param`` site (``"_data.<arg>"``), so the compiled ``init``/``update``
/``evaluate``/``run`` take the data as inputs and a second ``init`` or an
``update`` with new data of the same shapes neither retraces nor recompiles.
Three cases keep the data fixed in the plan instead ("baked"):

* an argument that a fitted latent site's own prior depends on: the prior decides
  the layout (whitening, constraints), so new values of it retrace the model; except
  where that latent is a Gaussian block with its own whitened MultivariateNormal
  prior (a GP's kernel built from ``X``, with a likelihood of one predictor per
  element), whose whitening is read from the new data with its predictors, and
  where it is a leaf (``obs_mask``'s ``y_unobserved``: drawn from the model given
  the rest, not fitted);
* a Gaussian block's predictor matrices and offsets are read from the data once
  per data (one compiled program, :meth:`GaussianBlock.data_arrays`) and enter
  the compiled functions as inputs too; only when new data break the structure
  the block was planned with (a term read as one state per element no longer
  is) is it planned again from the cached trace (no retrace), and recompiled;
* models whose code needs concrete data (numpy calls on the data, Python
  control flow on its values): traced with the data as constants; new values
  retrace.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro

from ..analysis.layout import site_posterior
from ..engine.step import CVIState, cvi
from ..families import unwrap_distribution
from ..jaxpr import structural_jit
from ..plan import schedule as _planner
from .convergence import diagnose_schedule, report
from .fit import (
    _WINDOW,
    _checked_posterior_of,
    _chunk_runner,
    average_iterates,
    gaussian_shift,
    posterior_of,
    run_loop,
)
from .hyper import EMOptions, ParamSpace, m_step, run_em

__all__ = ["CVI", "CVIRunState", "CVIRunResult"]

# Name prefix of the hidden param sites that carry the model's array arguments.
_DATA_PREFIX = "_data."
# The key of the compiled functions' inputs that holds the Gaussian blocks' arrays read
# from the data (GaussianBlock.data_arrays): block name -> arrays.
_BLOCKS = "_blocks"
# Plans kept per CVI object (older states of baked plans lose their posterior).
_MAX_PLANS = 16


class CVIRunState(NamedTuple):
    """The state :class:`CVI` passes between calls.

    ``state``: the engine's :class:`~autocvi.engine.CVIState` (natural
    parameters, rng key, iteration); ``plan``: which of the CVI object's plans
    (schedule for one shape of the data) it belongs to; ``inputs``: the data the
    state was computed on, when its Gaussian blocks read them (their posterior
    depends on the predictors), else None.
    """

    state: CVIState
    plan: int
    inputs: dict | None = None


class CVIRunResult(NamedTuple):
    """What :meth:`CVI.run` returns: NumPyro's ``SVIRunResult`` plus three fields.

    ``params``: the model's ``numpyro.param`` values; ``state``: a
    :class:`CVIRunState` (pass it to ``get_posterior``/``guide`` or back as
    ``init_state``); ``losses``: ``-elbo`` per iteration (NumPyro's
    convention); ``elbo``: the ELBO per iteration (numpy); ``converged``: the
    stopping rule of :func:`autocvi.fit` was met and the health checks passed;
    ``num_steps``: iterations run.
    """

    params: dict
    state: CVIRunState
    losses: np.ndarray
    elbo: np.ndarray
    converged: bool
    num_steps: int


class _Carry(NamedTuple):
    """The chunk runner's state: the engine state plus the data it is bound to."""

    cvi_state: CVIState
    inputs: dict

    @property
    def iteration(self):
        return self.cvi_state.iteration


@dataclass
class _Traced:
    """One trace of the model (per static arguments and array shapes)."""

    schedule: Any  # the schedule planned with the traced data
    wrapped: tuple  # array arguments that are data inputs (hidden params)
    baked: dict  # array arguments traced as constants: name -> value
    plan: Any = None  # the latest _Plan built from this trace


@dataclass
class _Plan:
    """A schedule, its algorithms and their compiled functions."""

    id: int
    traced: _Traced
    schedule: Any
    algorithm: Any
    bound: bool  # data enter the compiled functions as inputs
    data: dict  # the data values the schedule was planned with (param name -> array)
    compiled: dict = field(default_factory=dict)
    # (inputs, the Gaussian blocks' arrays read from them): the last data's
    block_arrays: tuple | None = None


class CVI:
    """Conjugate-computation variational inference with ``numpyro.infer.SVI``'s interface.

    Args:
        model: a NumPyro model.
        num_samples: Monte Carlo draws per estimated message (default: 64 when a
            multivariate Gaussian node has Monte Carlo messages, else 16).
        step_size: beta; default as :func:`autocvi.fit` (1 when every message is
            exact, 0.1 with Fisher-route messages, else 0.5).
        tol: convergence tolerance of :meth:`run` (default as ``fit``: 1e-6 for
            deterministic schedules, 1e-4 otherwise; 0 runs every step).
        structure: as :func:`autocvi.fit`: ``"joint"`` (latents a factor couples
            share one Gaussian q) or ``"mean-field"``.
        init_strategy: where q starts, a NumPyro ``init_to_*`` strategy (see
            :func:`autocvi.fit`).
        em: how :meth:`run` learns the model's ``numpyro.param`` sites
            (:class:`autocvi.EMOptions`; variational EM as in :func:`autocvi.fit`);
            ``update`` is one E-step (CVI iteration) with the params held.
        **planner_options: options of the planner, as for :func:`autocvi.fit`
            (:data:`autocvi.PLANNER_OPTIONS`): ``use_quadrature=False``
            (Monte Carlo messages where Gauss-Hermite ones would be used),
            ``step_size_decay``, ``gaussian_blocks=False``. An unknown name
            raises a ``TypeError`` listing the valid ones.

    There is no guide argument: q is chosen by autocvi (one family per latent,
    Gaussian blocks where the structure allows); :meth:`guide` returns it as a
    guide for ``numpyro.infer.Predictive``.
    """

    def __init__(
        self,
        model,
        *,
        num_samples: int | None = None,
        step_size=None,
        tol=None,
        structure="joint",
        init_strategy=None,
        em: EMOptions | None = None,
        **planner_options,
    ):
        self.planner_options = _planner.check_planner_options(planner_options, "CVI")
        self.em = em or EMOptions()
        self.model = model
        self.init_strategy = init_strategy
        self.num_samples = num_samples
        self.step_size = step_size
        self.tol = tol
        self.structure = structure
        self._traced: dict = {}
        self._plans: dict = {}
        self._next_id = 0
        # The state the last update returned and the data it stepped on: an update that
        # continues from it on the same data keeps the engine's data caches (a Gaussian
        # block's line-search trial and Anderson history) as CVI.run's loop does.
        self._last_update = None
        try:
            self._signature = inspect.signature(model)
        except (TypeError, ValueError):
            self._signature = None

    # ------------------------------------------------------------- SVI API
    def init(self, rng_key, *args, **kwargs) -> CVIRunState:
        """Trace and plan the model for these arguments (cached per shape) and start CVI."""
        plan, inputs = self._prepare(args, kwargs)
        state = self._compiled(plan, "init")(_as_key(rng_key), inputs)
        return _run_state(state, plan, inputs)

    def update(self, state: CVIRunState, *args, **kwargs):
        """One CVI step (compiled once per shape). Returns ``(state, elbo)``.

        The ELBO is the one after the step, as ``fit`` reports it. Steps that each
        continue from the state the previous one returned, on the same data, take the
        same path as :meth:`run`'s loop; any other state or data starts the engine's
        data caches afresh (streaming data, or a state from elsewhere).
        """
        plan, inputs = self._prepare(args, kwargs)
        state = self._adopt(plan, state, inputs)
        sched = plan.schedule
        last = self._last_update
        continues = (
            last is not None
            and last[0] is state
            and state.plan == plan.id  # data baked into a plan changed: a new plan
            and last[1].keys() == inputs.keys()
            and all(_same_array(last[1][k], v) for k, v in inputs.items() if k != _BLOCKS)
        )
        new, elbo = self._step(
            plan, state, inputs, sched.step_size, sched.block_step_size, fresh=not continues
        )
        out = _run_state(new, plan, inputs)
        self._last_update = (out, inputs)
        return out, elbo

    def evaluate(self, state: CVIRunState, *args, **kwargs) -> float:
        """The ELBO at ``state`` (no update; a fresh estimate when messages are sampled)."""
        plan, inputs = self._prepare(args, kwargs)
        state = self._adopt(plan, state, inputs)
        return float(self._step(plan, state, inputs, 0.0, 0.0)[1])

    def run(
        self, rng_key, num_steps: int, *args, progress_bar=False, init_state=None, **kwargs
    ) -> CVIRunResult:
        """Run up to ``num_steps`` iterations, stopping at convergence as :func:`autocvi.fit`.

        ``init_state``: a :class:`CVIRunState` to continue from (``rng_key`` is
        then unused). The loop runs in compiled chunks (``fit``'s chunk runner),
        compiled once per CVI object, data shapes and ``tol``.
        """
        if num_steps < 1:
            raise ValueError(f"num_steps must be at least 1, got {num_steps}")
        plan, inputs = self._prepare(args, kwargs)
        if init_state is None:
            state = self._compiled(plan, "init")(_as_key(rng_key), inputs)
        else:
            # The engine caches what depends on the data: recompute it for these data.
            adopted = self._adopt(plan, init_state, inputs)
            state = self._for_data(plan, adopted.state, inputs)
        schedule = plan.schedule
        exact = schedule.deterministic
        subsampled = any(f.subsampled for f in schedule.factors.values())
        tol = self.tol if self.tol is not None else (1e-6 if exact else 1e-4)
        runner = self._compiled(plan, ("run", float(tol), subsampled))
        # As fit: q's chunk averages must also have settled (None: nothing to watch).
        shift = self._compiled(plan, "shift")
        # As fit: a resumed run may legitimately not move (it started at the optimum).
        initial = state.natural if init_state is None else None
        trace = None
        if not schedule.learned:
            carry, elbos, converged, steps = _loop(
                runner, _Carry(state, inputs), num_steps, progress_bar, shift
            )
            state = carry.cvi_state
        else:
            em = self.em.resolved(
                num_steps, exact, 2 * _WINDOW, schedule.objective.expectation_of_log_density
            )
            mstep = self._compiled(plan, ("mstep", em))
            move = self._compiled(plan, "move")

            def e_step(state, max_steps):
                carry, elbos, converged, steps = _loop(
                    runner, _Carry(state, inputs), max_steps, progress_bar, shift
                )
                return carry.cvi_state, elbos, converged, 0.0, steps

            state, elbos, converged, _, steps, trace = run_em(
                e_step,
                lambda state, key, memory: mstep(state, key, memory, inputs),
                lambda state, values: move(state, values, inputs),
                state,
                jax.random.fold_in(state.rng_key, 7),
                ParamSpace(schedule.graph, schedule.learned),
                exact,
                em,
            )
        if converged and not exact:
            # As fit: average the jittering iterates of Monte Carlo messages
            # (Polyak-Ruppert, 2 * WINDOW more iterations).
            state = self._compiled(plan, "average")(state, inputs)
        diagnostics = diagnose_schedule(
            schedule, elbos, initial, state.natural, exact, subsampled, steps
        )
        if trace is not None:
            trace.excuse_boundaries(diagnostics, elbos)
        report(diagnostics, elbos.size)
        run_state = _run_state(state, plan, inputs)
        return CVIRunResult(
            params=self.get_params(run_state),
            state=run_state,
            losses=-elbos,
            elbo=elbos,
            converged=bool(converged and diagnostics.trustworthy),
            num_steps=int(elbos.size),
        )

    def get_params(self, state: CVIRunState) -> dict:
        """The model's ``numpyro.param`` values: the learned ones at ``state``, the
        fixed ones as traced."""
        params = {**self._plan_of(state).schedule.params, **state.state.params}
        return {k: v for k, v in params.items() if not k.startswith(_DATA_PREFIX)}

    def get_posterior(self, state: CVIRunState) -> dict:
        """Latent site -> q as a numpyro Distribution over the site's value (as ``fit``).

        Members of a joint Gaussian group get their marginals; :meth:`guide`
        samples the group jointly.
        """
        # One program per plan, its data (a Gaussian block's arrays) as inputs: a posterior
        # after each run on new data is built without tracing again (a GP's 175-dimensional
        # q(f): 22 ms per call traced, most of each fit of a 225-kernel grid).
        program = self._compiled(self._plan_of(state), "posterior")
        inputs = state.inputs or {}
        return posterior_of(
            self.get_schedule(state), state.state, lambda natural: program(natural, inputs)
        )

    def guide(self, state: CVIRunState):
        """q as a guide for ``numpyro.infer.Predictive`` (a :class:`~autocvi.infer.guide.CVIGuide`)."""
        from .guide import CVIGuide

        schedule = self.get_schedule(state)
        natural = state.state.natural
        joint = []
        for group in schedule.joint:
            lam = natural[group.name]
            block = schedule.blocks.get(group.name)
            q_z = (
                block.posterior(lam)
                if block is not None
                else site_posterior(schedule.nodes[group.name].layout, lam)
            )
            joint.append((group, q_z))
        return CVIGuide(
            self.get_posterior(state), joint=joint, model=self.model, source=self, state=state
        )

    def get_schedule(self, state: CVIRunState):
        """The :class:`~autocvi.plan.Schedule` a state belongs to (``print`` it), with
        its Gaussian blocks read from the data the state was computed on."""
        schedule = self._plan_of(state).schedule
        if state.inputs is None:
            return schedule
        bound = replace(
            schedule,
            params=dict(schedule.params),
            blocks=dict(schedule.blocks),
            nodes=dict(schedule.nodes),
        )
        _Bound(bound, state.inputs).__enter__()  # applied for good, to the copy
        return bound

    # ------------------------------------------------------------ plumbing
    def _adopt(self, plan, state: CVIRunState, inputs) -> CVIRunState:
        """``state`` for ``plan`` when it belongs to another plan of this object (data
        baked into a plan changed, or new data broke a Gaussian block's structure): the
        same q where the two plans hold a node alike; a node that was a block and is not
        any more gets the block's q as natural parameters; a node that became a block
        starts from its initial sites. Every cache of the data comes from ``plan``'s
        own start."""
        if state.plan == plan.id:
            return state
        fresh = self._compiled(plan, "init")(state.state.rng_key, inputs)

        def shapes(tree):
            return jax.tree_util.tree_map(lambda x: (jnp.shape(x), jnp.result_type(x)), tree)

        old_natural = state.state.natural
        if shapes(old_natural) == shapes(fresh.natural):
            engine = state.state  # as before: the same layout of q
        else:
            old = self.get_schedule(state)
            natural = dict(fresh.natural)
            for name, lam in old_natural.items():
                if name not in natural:
                    continue
                if name in old.blocks and name not in plan.schedule.blocks:
                    lam = old.blocks[name].natural(lam)
                if shapes(lam) == shapes(natural[name]):
                    natural[name] = lam
            engine = fresh._replace(
                natural=natural, rng_key=state.state.rng_key, iteration=state.state.iteration
            )
        return CVIRunState(engine, plan.id, state.inputs)

    def _plan_of(self, state):
        pid = int(np.asarray(state.plan))
        if pid not in self._plans:
            raise KeyError(
                "this state belongs to a plan this CVI object no longer holds (or to another "
                "CVI object); run init again."
            )
        return self._plans[pid]

    def _bind(self, args, kwargs) -> dict:
        """The model's arguments as the keyword dict autocvi traces with."""
        if not args:
            return dict(kwargs)
        if self._signature is None:
            raise TypeError(
                "the model's signature cannot be inspected: pass its arguments by keyword"
            )
        bound = self._signature.bind_partial(*args, **kwargs)
        out = {}
        for name, value in bound.arguments.items():
            kind = self._signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                raise TypeError(
                    f"the model takes *{name}; autocvi calls models with keyword arguments "
                    "only: give the model named parameters"
                )
            if kind is inspect.Parameter.VAR_KEYWORD:
                out.update(value)
            else:
                out[name] = value
        return out

    def _prepare(self, args, kwargs):
        """``(plan, inputs)`` for these model arguments; traces/plans only when needed."""
        data = self._bind(args, kwargs)
        arrays = {k: jnp.asarray(v) for k, v in data.items() if _is_data_array(v)}
        static = {k: v for k, v in data.items() if k not in arrays}
        key = (
            tuple(sorted((k, _static_key(v)) for k, v in static.items())),
            tuple(sorted((k, a.shape, str(a.dtype)) for k, a in arrays.items())),
        )
        traced = self._traced.get(key)
        if traced is not None and not all(
            _same_array(traced.baked[k], data[k]) for k in traced.baked
        ):
            traced = None  # a baked argument changed: trace again
        if traced is None:
            traced = self._trace(data, arrays)
            self._traced[key] = traced
        inputs = {_DATA_PREFIX + k: arrays[k] for k in traced.wrapped}
        plan = traced.plan
        if plan is None:
            plan = self._new_plan(traced, traced.schedule, inputs)
        elif not plan.bound and not all(_same_array(plan.data[k], v) for k, v in inputs.items()):
            # Data baked into the plan changed: plan again from the cached trace.
            plan = self._new_plan(traced, self._replan(traced.schedule, inputs), inputs)
        if plan.bound and plan.schedule.blocks:
            blocks = self._block_arrays(plan, inputs)
            if blocks is None:
                # These data break a block's structure: plan again for them (baked).
                schedule = self._replan(traced.schedule, inputs)
                plan = self._new_plan(traced, schedule, inputs, bound=False)
            else:
                inputs = {**inputs, _BLOCKS: blocks}
        return plan, (inputs if plan.bound else {})

    def _block_arrays(self, plan, inputs):
        """The Gaussian blocks' arrays read from ``inputs`` (one compiled program, its
        result kept for the last data), or None if a block's structure does not hold."""
        last = plan.block_arrays
        if last is not None and all(_same_array(last[0][k], v) for k, v in inputs.items()):
            return last[1]
        arrays, ok = self._compiled(plan, "block_arrays")(inputs)
        if not bool(ok):
            return None
        plan.block_arrays = (dict(inputs), arrays)
        return arrays

    def _options(self, data_params) -> dict:
        """The planner options, with the hidden data params held (inputs, never learned)."""
        options = dict(self.planner_options)
        options["fixed_params"] = (*options.get("fixed_params", ()), *data_params)
        return options

    def _replan(self, base, inputs):
        """``base`` planned again for other values of the hidden data params (no trace)."""
        values = {**base.graph.example_values, **inputs}
        graph = replace(base.graph, _example_values=values)
        data_params = (p for p in graph.params if p.startswith(_DATA_PREFIX))
        options = self._options(data_params)
        for name in _planner.PLAN_ONLY_OPTIONS:  # decided by the base plan, kept below
            options.pop(name, None)
        schedule = _planner.build_schedule(
            graph,
            num_samples=self.num_samples,
            step_size=self.step_size,
            **options,
        )
        schedule.joint, schedule.notes, schedule.user_graph = (
            base.joint,
            base.notes,
            base.user_graph,
        )
        schedule.leaves, schedule.fitted_model = base.leaves, base.fitted_model
        return schedule

    def _trace(self, data, arrays) -> _Traced:
        """Trace and plan (``autocvi.plan``, as ``fit``) with the array arguments as
        hidden params, except those a latent's prior reads."""
        names = tuple(arrays)
        try:
            schedule = self._plan_wrapped(data, arrays, names)
            # Arguments a latent's own prior reads decide its layout: keep them constant.
            graph = schedule.user_graph or schedule.graph
            hidden = {_DATA_PREFIX + k for k in names}
            rebound = {n for n, b in schedule.blocks.items() if b.whitened_own_prior}
            # A leaf (held at its prior conditional, not fitted) is drawn from the model
            # with the current data: its prior may read them.
            in_priors = {
                p[len(_DATA_PREFIX) :]
                for n in graph.latent_names
                if n not in rebound and n not in schedule.leaves
                for p in graph.factors[n].params
                if p in hidden
            }
            if in_priors:
                names = tuple(k for k in names if k not in in_priors)
                schedule = self._plan_wrapped(data, arrays, names)
        except Exception:  # noqa: BLE001 - the model needs concrete data: trace it as fit does
            names = ()
            schedule = self._plan_wrapped(data, arrays, names)
        baked = {k: data[k] for k in arrays if k not in names}
        return _Traced(schedule, names, baked)

    def _plan_wrapped(self, data, arrays, names):
        model = _with_data_params(self.model, names) if names else self.model
        traced_data = {**data, **{k: arrays[k] for k in names}}
        options = self._options(_DATA_PREFIX + k for k in names)
        return _planner.plan(
            model,
            traced_data,
            num_samples=self.num_samples,
            step_size=self.step_size,
            structure=self.structure,
            init_strategy=self.init_strategy,
            **options,
        )

    def _new_plan(self, traced: _Traced, schedule, inputs, bound=True) -> _Plan:
        # A Gaussian block's prior must not read the data (its arrays other than the
        # predictors' and a whitening's are not read again): such data are baked instead.
        hidden = {_DATA_PREFIX + k for k in traced.wrapped}
        graph = schedule.graph
        bound = (
            bound
            and bool(traced.wrapped)
            and all(
                block.whitened_own_prior
                or all(
                    f in graph.factors and not set(graph.factors[f].params) & hidden
                    for f in block.prior_factors
                )
                for block in schedule.blocks.values()
            )
        )
        plan = _Plan(
            id=self._next_id,
            traced=traced,
            schedule=schedule,
            algorithm=cvi(schedule),
            bound=bound,
            data=dict(inputs),
        )
        self._next_id += 1
        traced.plan = plan
        self._plans[plan.id] = plan
        while len(self._plans) > _MAX_PLANS:
            self._plans.pop(next(iter(self._plans)))
        return plan

    def _for_data(self, plan, state, inputs):
        """``state`` with what the engine caches from the data recomputed for ``inputs``:
        the messages that depend on the data only (constant messages), and no Gaussian
        block's line-search trial (``CVIState.block_cache``: ``update`` may be called
        with new data each time, as in streaming)."""
        consts, terms, cache = self._compiled(plan, "constants")(inputs, state.params)
        return state._replace(constant_messages=consts, constant_terms=terms, block_cache=cache)

    def _step(self, plan, state, inputs, beta, block_beta, fresh=True):
        engine_state = self._for_data(plan, state.state, inputs) if fresh else state.state
        dtype = jnp.result_type(float)
        return self._compiled(plan, "step")(
            engine_state, inputs, jnp.asarray(beta, dtype), jnp.asarray(block_beta, dtype)
        )

    def _compiled(self, plan: _Plan, what):
        if what not in plan.compiled:
            plan.compiled[what] = _compile(plan, what)
        return plan.compiled[what]


# ------------------------------------------------------------------ helpers


def _compile(plan: _Plan, what):
    """The jitted function ``what`` of a plan; data enter as ``inputs``.

    ``"step"`` takes the step sizes as inputs too, so that ``evaluate`` (step
    sizes 0: the state does not move and the ELBO is the one at the state)
    shares ``update``'s compiled step.
    """
    schedule, algorithm = plan.schedule, plan.algorithm

    def constants(inputs, learned):
        # At the learned params' current values (init reads them from the schedule).
        with _Bound(schedule, {**inputs, **learned}):
            fresh = algorithm.init(jax.random.PRNGKey(0))
        return fresh.constant_messages, fresh.constant_terms, fresh.block_cache

    if what == "constants":
        return structural_jit(constants)
    if what == "block_arrays":

        def block_arrays(inputs):
            with _Bound(schedule, inputs):
                values = _block_values(schedule)
                read = {
                    n: b.data_arrays(values, _whitening(schedule, n, values))
                    for n, b in schedule.blocks.items()
                }
            ok = jnp.all(jnp.stack([r[1] for r in read.values()]))
            return {n: r[0] for n, r in read.items()}, ok

        return structural_jit(block_arrays, runs_once=True)
    if what == "init":

        def init(key, inputs):
            with _Bound(schedule, inputs):
                return algorithm.init(key)

        return structural_jit(init)
    if what == "step":

        def step(state, inputs, beta, block_beta):
            with _Bound(schedule, inputs, (beta, block_beta)):
                new, info = algorithm.step(state)
            return new, info.elbo

        return structural_jit(step)
    if what == "average":

        def average(state, inputs):
            def step(s):
                with _Bound(schedule, inputs):
                    return algorithm.step(s)

            return average_iterates(step, state, 2 * _WINDOW)

        return structural_jit(average)
    if what == "move":

        def move(state, values, inputs):
            with _Bound(schedule, inputs):
                return algorithm.move_params(state, values)

        return structural_jit(move, runs_once=True)
    if isinstance(what, tuple) and what[0] == "mstep":
        space = ParamSpace(schedule.graph, schedule.learned)
        run = m_step(algorithm, space, schedule.deterministic, what[1])

        def mstep(state, key, memory, inputs):
            with _Bound(schedule, inputs):
                return run(state, key, memory)

        return structural_jit(mstep)
    if isinstance(what, tuple) and what[0] == "run":
        _, tol, subsampled = what

        def run_step(carry: _Carry):
            with _Bound(schedule, carry.inputs):
                new, info = algorithm.step(carry.cvi_state)
            return _Carry(new, carry.inputs), info

        # As fit: with estimated messages the runner averages q over each chunk, for the
        # check that those averages settled (shift).
        track = None if schedule.deterministic else _natural_of_carry
        return _chunk_runner(run_step, tol, schedule.deterministic, subsampled, track)
    if what == "posterior":

        def posterior(natural, inputs):
            with _Bound(schedule, inputs):
                return _checked_posterior_of(schedule, natural)

        return structural_jit(posterior, runs_once=True)
    if what == "shift":
        return None if schedule.deterministic else gaussian_shift(schedule)
    raise ValueError(what)


def _natural_of_carry(carry):
    return carry.cvi_state.natural


class _Bound:
    """Temporarily give the schedule's data params (and step sizes) other values.

    The engine reads ``schedule.params``, ``schedule.blocks`` and the step sizes
    when its functions are traced, so inside ``jit`` they become inputs of the
    compiled function instead of constants. ``values[_BLOCKS]``: the Gaussian
    blocks' arrays for these data (:meth:`GaussianBlock.data_arrays`).
    """

    def __init__(self, schedule, values: dict, step_sizes=None):
        self.schedule, self.step_sizes = schedule, step_sizes
        self.values = {k: v for k, v in values.items() if k != _BLOCKS}
        self.blocks = values.get(_BLOCKS)

    def __enter__(self):
        schedule = self.schedule
        params = schedule.params
        self.saved = {k: params[k] for k in self.values}
        self.saved_steps = (schedule.step_size, schedule.block_step_size)
        self.saved_blocks = dict(schedule.blocks)
        params.update(self.values)
        if self.step_sizes is not None:
            schedule.step_size, schedule.block_step_size = self.step_sizes
        if self.blocks is not None:
            # In place: the engine's functions hold this dict.
            values = _block_values(schedule)
            self.saved_nodes = dict(schedule.nodes)
            for name, arrays in self.blocks.items():
                block = schedule.blocks[name].with_data(values, arrays)
                schedule.blocks[name] = block
                schedule.nodes[name] = replace(schedule.nodes[name], layout=block.layout)

    def __exit__(self, *exc):
        self.schedule.params.update(self.saved)
        self.schedule.step_size, self.schedule.block_step_size = self.saved_steps
        self.schedule.blocks.update(self.saved_blocks)
        if self.blocks is not None:
            self.schedule.nodes.update(self.saved_nodes)
        return False


def _block_values(schedule) -> dict:
    """What a Gaussian block's factors read (as when it was found: ``find_block``)."""
    return {**schedule.graph.example_values, **schedule.params}


def _whitening(schedule, name, values):
    """``(loc, scale_tril)`` of a whitened block's own prior at ``values``, or None."""
    block = schedule.blocks[name]
    if not block.whitened_own_prior:
        return None
    prior, _ = schedule.graph.site_fn(name)(values)
    base = unwrap_distribution(prior)
    return jnp.broadcast_to(base.loc, base.event_shape), base.scale_tril


def _run_state(state, plan, inputs) -> CVIRunState:
    """The state handed to the user: with its data when its blocks read them."""
    return CVIRunState(state, plan.id, inputs if _BLOCKS in inputs else None)


def _loop(runner, carry, num_steps, progress_bar, shift=None):
    """``fit``'s loop (:func:`autocvi.infer.fit.run_loop`) with a cached chunk runner, and
    ``fit``'s check that q's chunk averages settled (``shift``, :func:`gaussian_shift`)."""
    carry, elbos, converged, _, steps = run_loop(
        None,
        carry,
        num_steps,
        0.0,
        False,
        progress_bar=progress_bar,
        runner=runner,
        shift=shift,
        origin=None if shift is None else carry.cvi_state.natural,
    )
    return carry, elbos, converged, steps


def _with_data_params(model, names):
    """``model`` with the array arguments ``names`` read through ``numpyro.param`` sites."""

    def wrapped(*args, **kwargs):
        for k in names:
            if k in kwargs:
                kwargs[k] = numpyro.param(_DATA_PREFIX + k, kwargs[k], autocvi_data=True)
        return model(*args, **kwargs)

    # trace() checks the data against the model's own signature and names it in errors.
    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        if hasattr(model, attr):
            setattr(wrapped, attr, getattr(model, attr))
    wrapped.__wrapped__ = model
    return wrapped


def _is_data_array(value) -> bool:
    return (
        isinstance(value, (np.ndarray, jax.Array))
        and np.ndim(value) >= 1
        and (jnp.issubdtype(value.dtype, jnp.number) or jnp.issubdtype(value.dtype, jnp.bool_))
    )


def _static_key(value):
    try:
        hash(value)
        return value
    except TypeError:
        return ("repr", type(value).__name__, repr(value))


def _same_array(a, b) -> bool:
    if a is b:
        return True
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))


def _as_key(rng_key):
    if rng_key is None:
        rng_key = 0
    if isinstance(rng_key, int):
        return jax.random.PRNGKey(rng_key)
    return rng_key
