"""``autocvi.fit``: trace, plan, and run CVI to convergence; the FitResult."""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.infer import Predictive

from ..analysis.integrate import integrated_marginal
from ..analysis.joint import member_posteriors
from ..analysis.layout import site_posterior
from ..blocks.gaussian_block import _MAX_DENSE_POSTERIOR
from ..engine.step import CVIState, cvi
from ..families import gaussian_mean_variance
from ..jaxpr import structural_jit
from ..model.graph import FactorGraph, _format_table
from ..model.message_kinds import EXACT
from ..plan.schedule import Schedule, check_planner_options, plan
from . import gradient_training
from .convergence import (
    LONG_WINDOW,
    WINDOW,
    Diagnostics,
    FitWarning,
    converged_now,
    diagnose,
    diagnose_schedule,
    report,
    still_climbing,
)
from .coupling import mean_field_couplings, warn_mean_field_coupling
from .gradient_training import GradientState
from .guide import CVIGuide, joint_posteriors
from .hyper import EMOptions, EMTrace, ParamSpace, m_step, run_em
from .importance import check_importance, warn_importance

__all__ = ["fit", "FitResult", "IllConditionedError"]


def _ill_conditioned(name: str, lam) -> IllConditionedError:
    """The error for a q whose precision fails its Cholesky at this dtype."""
    prec = -2.0 * np.asarray(lam[1], dtype=np.float64)
    detail = ""
    if prec.ndim >= 2:
        ev = np.linalg.eigvalsh(0.5 * (prec + np.swapaxes(prec, -1, -2)))
        ratio = float(np.max(np.abs(ev)) / max(float(np.min(np.abs(ev))), 1e-300))
        detail = f" (condition number of its precision ~{ratio:.1e})"
    dtype = jnp.asarray(lam[1]).dtype
    return IllConditionedError(
        f"q for {name!r} is too ill-conditioned to represent in {dtype}{detail}: its "
        f"coordinates are strongly correlated or on very different scales (an uncentred "
        f"predictor in the thousands makes the intercept and slope correlated at -0.9999). "
        f"Centre and scale the predictors, or enable float64 before anything else runs: "
        f"jax.config.update('jax_enable_x64', True)."
    )


@dataclass
class FitResult:
    """The outcome of :func:`fit`.

    Attributes:
        posterior: latent site name -> numpyro Distribution over the site's
            value (its own support and shape).
        elbo: ELBO after every iteration, shape ``(num_steps,)``.
        graph: the classified FactorGraph (edges carry message kinds).
        schedule: the message-passing schedule that ran.
        state: a :class:`~autocvi.engine.CVIState` (a
            :class:`~autocvi.infer.gradient_training.GradientState` when trained with
            ``optimizer=``); pass it back as ``fit(..., init_state=result.state)`` to
            continue.
        converged: the stopping rule was met (:mod:`autocvi.infer.convergence`)
            *and* every health check passed; False whenever the ELBO was ever
            non-finite, a deterministic ELBO decreased, a variance collapsed
            or the state never moved (each also raises a ``FitWarning``).
        elbo_final: the ELBO of the returned q: ``elbo[-1]`` for deterministic
            schedules; with Monte Carlo messages the mean of 64 independent
            estimates at the returned (iterate-averaged) state, far less noisy
            than the per-iteration trace.
        restart_elbos: ``elbo_final`` of every restart (the best one is returned).
        diagnostics: what the health checks found
            (:class:`~autocvi.infer.convergence.Diagnostics`).
        num_steps: iterations run in this call.
        wall_time: seconds spent in the loop (compilation included; with learned params,
            the E- and M-steps of every EM round).
        params: the model's ``numpyro.param`` values: learned ones (variational
            EM, :mod:`autocvi.infer.hyper`) and fixed ones; pass them to
            ``numpyro.infer.Predictive(..., params=result.params)``.
        em: what variational EM did (rounds, the M-steps' bounds, the params
            after each round), or None when no param was learned.
    """

    posterior: dict
    elbo: np.ndarray
    graph: FactorGraph
    schedule: Schedule
    state: CVIState
    converged: bool
    num_steps: int
    wall_time: float = 0.0
    diagnostics: Diagnostics = field(default_factory=Diagnostics)
    elbo_final: float = float("nan")
    restart_elbos: np.ndarray = field(default_factory=lambda: np.zeros(0))
    params: dict = field(default_factory=dict)
    em: EMTrace | None = None
    _layouts: dict = field(default_factory=dict, repr=False)
    # the model and data the fit ran on: sample() computes the deterministic sites
    _model: object = field(default=None, repr=False)
    _data: dict | None = field(default=None, repr=False)

    def sample(self, rng_key, num_samples: int, deterministic: bool = True) -> dict:
        """Posterior draws: site -> array ``(num_samples,) + site shape``.

        Every latent site, and (``deterministic=True``, as ``MCMC.get_samples``) every
        ``numpyro.deterministic`` site, computed from the latents' draws by running the
        model on them with the fit's data and params. Latents read by no factor but
        their own density (``schedule.leaves``, :mod:`autocvi.analysis.leaves`) are drawn
        the same way, from their prior conditional given each draw. Models with
        subsampled plates get the latents only: their deterministic sites exist per
        minibatch (run ``Predictive`` on a model whose plates take the full size). The
        dict can be passed to ``numpyro.infer.Predictive(model, posterior_samples=...)``.
        """
        if isinstance(rng_key, int):
            rng_key = jax.random.PRNGKey(rng_key)
        out = self._latent_draws(rng_key, num_samples)
        graph = self.schedule.user_graph or self.schedule.graph
        subsampled = any(f.subsampled for f in self.schedule.factors.values())
        wanted = deterministic and self._model is not None and not subsampled
        names = (*self.schedule.leaves, *(graph.deterministic_names if wanted else ()))
        if names:
            key = jax.random.fold_in(rng_key, 1)  # the model's own sampling, if any
            predictive = Predictive(
                self._model, posterior_samples=out, params=self.params, return_sites=list(names)
            )
            try:
                out.update(predictive(key, **(self._data or {})))
            except Exception as err:  # noqa: BLE001 - the latents' draws stand on their own
                warnings.warn(
                    f"the sites {', '.join(map(repr, names))} could not be computed from "
                    f"q's draws ({type(err).__name__}: {err}); the draws hold the latent "
                    "sites q holds only. Pass deterministic=False to skip the deterministic "
                    "sites, or run numpyro.infer.Predictive(model, posterior_samples=draws) "
                    "yourself.",
                    FitWarning,
                    stacklevel=2,
                )
            order = [*graph.latent_names, *names]
            out = {n: out[n] for n in order if n in out}
        return out

    def _latent_draws(self, rng_key, num_samples: int) -> dict:
        if isinstance(rng_key, int):
            rng_key = jax.random.PRNGKey(rng_key)
        out = {}
        for name, lay in self._layouts.items():
            rng_key, sub = jax.random.split(rng_key)
            block = self.schedule.blocks.get(name)
            if block is not None:
                draws = block.sample_x(self.state.natural[name], sub, num_samples)
            else:
                draws = lay.fam.sample(sub, self.state.natural[name], (num_samples,))
            out[name] = _full_plate_layout(lay, self.schedule.nodes.get(name)).to_site(draws)
        for group in self.schedule.joint:
            out.update(group.values(out.pop(group.name)))
        return out

    def summary(self, max_elements: int = 6) -> str:
        """Posterior mean, sd and 5%/95% quantiles per site (first elements of arrays)."""
        draws = self.sample(jax.random.PRNGKey(0), 2000)
        rows = []
        for name, x in draws.items():
            x = np.asarray(x, dtype=float).reshape(x.shape[0], -1)
            for k in range(min(x.shape[1], max_elements)):
                col = x[:, k]
                label = name if x.shape[1] == 1 else f"{name}[{k}]"
                q5, q95 = np.quantile(col, [0.05, 0.95])
                rows.append(
                    (label, f"{col.mean():.4f}", f"{col.std():.4f}", f"{q5:.4f}", f"{q95:.4f}")
                )
            if x.shape[1] > max_elements:
                rows.append((f"{name}[...]", f"({x.shape[1] - max_elements} more)", "", "", ""))
        status = "converged" if self.converged else "not converged"
        head = (
            f"CVI: {self.num_steps} iterations ({status}), final ELBO {self.elbo[-1]:.4f}, "
            f"{self.wall_time:.2f} s"
        )
        check = self.diagnostics.importance
        if check is not None:
            verdict = (
                "q misses posterior mass"
                if check.misses_posterior
                else f"q too narrow at {check.narrowest.coordinate!r} "
                f"(sd {check.narrowest.ratio:.2f} of the importance-weighted)"
                if check.too_narrow
                else f"q too wide at {check.widest.coordinate!r} "
                f"(sd {check.widest.ratio:.2f} times the importance-weighted)"
                if check.too_wide
                else "no sign of a miss"
            )
            head += (
                f"\nq against the posterior ({check.num_draws} draws): Pareto-k "
                f"{check.pareto_k:.2f}, importance ESS {check.ess:.1%}: {verdict}"
            )
        return head + "\n" + _format_table(("site", "mean", "sd", "5%", "95%"), rows)


def fit(
    model,
    data=None,
    *,
    num_steps: int | None = None,
    step_size: float | None = None,
    rng_key=None,
    num_samples: int | None = None,
    tol: float | None = None,
    init_state: CVIState | None = None,
    progress_bar: bool = True,
    structure: str = "joint",
    num_restarts: int | None = None,
    batch_restarts: bool | None = None,
    init_strategy=None,
    em: EMOptions | None = None,
    check: bool = True,
    optimizer=None,
    **planner_options,
) -> FitResult:
    """Fit a NumPyro model with conjugate-computation variational inference.

    Args:
        model: a NumPyro model.
        data: keyword arguments for the model, observations included.
        num_steps: maximum iterations (default 100 when every message is
            exact, 500 otherwise). Stops early at convergence.
        step_size: beta; default 1 when every message is exact (VMP), 0.1 with
            Fisher-route messages, else 0.5.
        rng_key: a ``jax.random.PRNGKey`` or an int seed (default 0).
        num_samples: Monte Carlo draws per estimated message (default: 64 when a
            multivariate Gaussian node has Monte Carlo messages, else 16).
        tol: convergence tolerance (:mod:`autocvi.infer.convergence`): on
            three successive relative ELBO changes (default 1e-6) when every
            message is deterministic (exact or Gauss-Hermite, no
            subsampling); otherwise on the ELBO's trend over the last 20
            iterations, after a burn-in of 30 (default 1e-4). 0 runs all
            ``num_steps``.
        init_state: a previous ``FitResult.state`` to resume from.
        progress_bar: show a progress bar (tqdm, as NumPyro's ``SVI.run``).
        structure: ``"joint"`` (default): latents coupled by a factor share one
            Gaussian q (``plan()`` shows the groups and why);
            ``"mean-field"``: one q per site.
        num_restarts: fits from different starting points (``rng_key`` folded
            with the restart's index); the one with the best ELBO is returned
            and ``restart_elbos`` lists all. Default 3 when the model has
            discrete latents (mixtures and topic models have many fixed
            points), else 1.
        batch_restarts: run the restarts as one ``jax.vmap`` (:func:`vmapped_restarts`;
            not with learned params or ``init_state``), with the same results as one
            at a time. Default: on a GPU or TPU yes; on CPU no, where it was slower on
            every mixture measured (one core, three restarts: iris mixture 0.43 ->
            0.71 s warm, 9.5 -> 10.4 s cold; LDA 0.25 -> 0.45 s warm): the batched
            step computes both branches of its ``lax.cond`` and the finished
            restarts' frozen iterations, and takes longer to trace and compile.
        init_strategy: where q starts, as a NumPyro ``init_to_*`` strategy
            (``init_to_median()``, ``init_to_uniform()``, ``init_to_value(values=...)``);
            see :func:`autocvi.plan`. Flat priors (``ImproperUniform``) need no
            strategy: they start at ``init_to_uniform``.
        em: how ``numpyro.param`` sites are learned (:class:`autocvi.EMOptions`:
            rounds, E- and M-steps per round, optimiser). Params are learned by
            variational EM unless ``learn_params=False`` (or listed in
            ``fixed_params``); the M-step maximises the ELBO with q's sites
            held and the prior moving with the params (t-SVGP Eq. 15).
        check: after the fit, check q's quality and warn (``FitWarning``) where it
            is poor: latents q keeps independent that the posterior couples
            (:mod:`autocvi.infer.coupling`), and q's importance ratios p/q: their
            Pareto-k and effective sample size, and q's sds against the
            importance-weighted sds of its draws (:mod:`autocvi.infer.importance`,
            ``result.diagnostics.importance``). With the ELBO only: other objectives
            (``BetaELBO``, ``DLM``) do not aim q at the posterior. Together they cost a compiled Hessian
            of the log joint and 4,000 draws of it (a second or two of a cold fit);
            ``False`` skips them.
        optimizer: an optax optimiser (``optax.adam(0.01)``) to train q by ordinary
            gradient steps instead of CVI's natural-gradient steps, on the same
            objective: each Gaussian latent's mean and Cholesky factor (whitened where
            the prior is its own MultivariateNormal), the training of the DLM paper and
            of SVI's AutoMultivariateNormal (:mod:`autocvi.infer.gradient_training`).
            Runs exactly ``num_steps`` steps (required); ``converged`` says whether the
            objective's mean over the last tenth of the steps is within ``tol`` (relative)
            of the tenth before. Gaussian q's only, no learned params, no sampled-gradient
            DLM (each refused by name); every Gaussian latent is kept as dense natural
            parameters (``gaussian_blocks=False``). ``init_state=result.state`` resumes it.
        **planner_options: options of the planner
            (:data:`autocvi.PLANNER_OPTIONS`), passed to :func:`autocvi.plan`:
            ``use_quadrature=False`` replaces Gauss-Hermite messages by Monte
            Carlo ones (the CVI paper's plain "CVI" against its "CVI-exact");
            ``step_size_decay``: ``beta_t = beta (1 + t)^-decay`` for global
            nodes (default 0.6 with subsampled plates, else 0);
            ``gaussian_blocks=False`` keeps Gaussian nodes as dense natural
            parameters instead of prior + sites. An unknown name raises a
            ``TypeError`` listing the valid ones.

    Returns:
        a :class:`FitResult`.

    Mean-field between a conjugate latent (a Gamma precision) and the Gaussian it
    scales can be far too narrow (a centred hierarchy's group precision: sd 0.61 of
    NUTS's; a local-level model's precisions: 0.52-0.56), and so can mean-field between
    the Gamma factors U and V of a Poisson factorisation (means 0.7 sd off). When the
    after-fit coupling check finds that at such latents, ``fit`` fits again with them in
    the joint Gaussian group of what their factors touch (planner option
    ``joint_sites``, a Gaussian on their unconstrained scale) and keeps the refit if its
    ELBO is higher: both are ELBOs of the same model, so the higher one is the q closer
    to the posterior in KL. The result's ``diagnostics.refit`` says what was tried and
    ``schedule.notes`` which fit was kept; the warnings are the kept fit's.
    """
    check_planner_options(planner_options, "fit")
    if rng_key is None:
        rng_key = 0
    if isinstance(rng_key, int):
        rng_key = jax.random.PRNGKey(rng_key)
    if optimizer is not None or isinstance(init_state, GradientState):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = _fit_by_gradient(
                model,
                data,
                optimizer,
                num_steps=num_steps,
                rng_key=rng_key,
                tol=tol,
                init_state=init_state,
                progress_bar=progress_bar,
                structure=structure,
                init_strategy=init_strategy,
                check=check,
                **planner_options,
            )
        _warn_at_caller(caught)
        return result
    options = dict(
        num_steps=num_steps,
        step_size=step_size,
        rng_key=rng_key,
        num_samples=num_samples,
        tol=tol,
        init_state=init_state,
        progress_bar=progress_bar,
        structure=structure,
        num_restarts=num_restarts,
        batch_restarts=batch_restarts,
        init_strategy=init_strategy,
        em=em,
        check=check,
        **planner_options,
    )
    refit_allowed = check and structure == "joint" and init_state is None
    # Where a refit may replace this fit, its importance check (4,000 draws of the log
    # joint, a compiled program of its own) waits until the kept fit is known: the refit
    # is decided on the coupling check and the ELBOs, never on it, and the check of a
    # fit that is dropped was wasted (1-2 s of a cold Poisson factorisation).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _fit_once(model, data, **options, importance=not refit_allowed)
    sites = _refit_sites(result) if refit_allowed else ()
    if sites:
        joint = tuple(dict.fromkeys((*planner_options.get("joint_sites", ()), *sites)))
        with warnings.catch_warnings(record=True) as caught_refit:
            warnings.simplefilter("always")
            refit = _fit_once(model, data, **{**options, "joint_sites": joint}, importance=False)
        grouped = {m for g in refit.schedule.joint for m in g.member_names}
        gain = refit.elbo_final - result.elbo_final
        kept = set(sites) <= grouped and gain > 0
        line = (
            f"refit with {', '.join(sites)} in a joint Gaussian (joint_sites): the coupling "
            f"check found mean-field too narrow there; ELBO {refit.elbo_final:.6g} against "
            f"{result.elbo_final:.6g}, "
            + ("kept" if kept else "not kept" if set(sites) <= grouped else "no group formed")
        )
        if kept:
            result, caught = refit, caught_refit
        result.diagnostics.refit = line
        result.schedule.notes = (*result.schedule.notes, line)
    if refit_allowed:  # the kept fit's importance check, its warnings after the fit's own
        with warnings.catch_warnings(record=True) as late:
            warnings.simplefilter("always")
            _check_importance(
                model,
                data,
                result.schedule,
                result.params,
                result.state.natural,
                rng_key,
                result.diagnostics,
            )
        caught.extend(late)
    if check and result.schedule.objective.sampled_gradients and result.converged:
        caught.extend(_check_estimator_fixed_point(model, data, result, options))
    _warn_at_caller(caught)
    return result


def _check_estimator_fixed_point(model, data, result, options) -> list:
    """A fit whose gradients were sampling estimates (DLM's bMC, uPS) stops where the
    estimates vanish on average, which for a biased estimator (bMC: bias ~ 1/L) is not the
    objective's optimum. Ten steps with the quadrature's gradients from there say how far
    it is: if they gain more than 1 nat (and 1e-4 relative), the fit is not converged for
    the objective (``converged=False``) and a ``FitWarning`` says so. bMC with 10 draws on
    overdispersed counts (benchmarks/dlm_nonconjugate.py) stopped with its test NLL 1 nat
    above the quadrature fit's, saying it had converged."""
    objective = dataclasses.replace(result.schedule.objective, gradient="quadrature")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        probe = _fit_once(
            model,
            data,
            **{
                **options,
                "objective": objective,
                "init_state": result.state,
                "num_steps": 10,
                "tol": 0.0,
                "check": False,
            },
        )
    gain = probe.elbo_final - result.elbo_final
    if not gain > max(1.0, 1e-4 * abs(result.elbo_final)):
        return []
    result.converged = False
    message = (
        f"the fit with sampled gradients ({result.schedule.objective.describe()}) stopped at "
        f"the estimator's fixed point, not the objective's optimum: 10 steps with the "
        f"quadrature's gradients from there raise the objective by {gain:.3g} nats. Pass a "
        "larger num_samples, or gradient='quadrature' (exact for these one-dimensional "
        "predictors)."
    )
    result.diagnostics.messages.append(message)
    return [warnings.WarningMessage(FitWarning(message), FitWarning, __file__, 0)]


def _warn_at_caller(caught):
    """Issue the recorded warnings again under the caller's filters (they were recorded so
    that only the kept fit's are shown): autocvi's ``FitWarning`` at the line that called
    :func:`fit`, any other (a library's deprecation, say) where it was raised, so that a
    default filter hides it as before (attributed to ``__main__`` it would show)."""
    frame = sys._getframe(2)
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    module = frame.f_globals.get("__name__", "")
    for w in caught:
        if issubclass(w.category, FitWarning):
            where = (frame.f_code.co_filename, frame.f_lineno, module, registry)
        else:
            where = (w.filename, w.lineno)
        warnings.warn_explicit(w.message, w.category, *where)


def _refit_sites(result: FitResult) -> tuple[str, ...]:
    """The latents :func:`fit` refits in a joint Gaussian: latents of a continuous
    non-Gaussian family (Gamma, InverseGamma, Beta, Dirichlet) that the coupling check
    names, as too narrow or as the partner of one: a Gamma precision beside the effects
    it scales, or the plated Gamma factors U and V of a Poisson factorisation, whose
    posterior follows the ridge ``(U_k c, V_k / c)`` that mean-field cannot. The check
    runs only on models of at most ``coupling.MAX_COORDINATES`` coordinates, which
    bounds the joint Gaussian."""
    if result.schedule.learned:
        return ()
    out = []
    for c in result.diagnostics.couplings:
        for name in (c.name, c.partner):
            node = result.schedule.nodes.get(name)
            if node is None or name in out or node.layout.discrete or node.layout.gaussian:
                continue
            out.append(name)
    return tuple(out)


def _fit_once(
    model,
    data,
    *,
    num_steps,
    step_size,
    rng_key,
    num_samples,
    tol,
    init_state,
    progress_bar,
    structure,
    num_restarts,
    batch_restarts,
    init_strategy,
    em,
    check,
    importance: bool = True,
    **planner_options,
) -> FitResult:
    """One fit: :func:`fit` without its refit of coupled latents. ``importance=False``:
    the after-fit checks (``check``) without the importance check, which :func:`fit`
    runs on the fit it keeps (:func:`_check_importance`)."""
    schedule = plan(
        model,
        data,
        num_samples=num_samples,
        step_size=step_size,
        structure=structure,
        init_strategy=init_strategy,
        **planner_options,
    )
    exact = schedule.deterministic
    if num_steps is None:
        num_steps = 100 if schedule.all_exact else 500
    if tol is None:
        tol = 1e-6 if exact else 1e-4
    algorithm = cvi(schedule)
    subsampled = any(f.subsampled for f in schedule.factors.values())
    if num_restarts is None:
        # Discrete latents (mixtures, topics) have many fixed points.
        discrete = any(n.layout.discrete for n in schedule.nodes.values())
        num_restarts = 3 if discrete and init_state is None else 1
    init = structural_jit(algorithm.init, runs_once=True)
    # Compiled once and shared by the restarts (a jit per restart recompiled).
    # Minibatched fits too: their ELBO estimate is so noisy that a window's trend can
    # vanish by chance while q is still on its way (an SVGP on 2,000 points, B = 200,
    # stopped 0.9 posterior sd short of the full-batch optimum with converged=True).
    shift = None if exact else gaussian_shift(schedule)
    # With estimated messages the runner also averages q over its chunk: the
    # final iterate averaging reuses it instead of compiling the step again.
    track = None if exact else _natural
    runner = _chunk_runner(algorithm.step, tol, exact, subsampled, track)
    estimator = None if exact else elbo_estimator(algorithm)
    learned = schedule.learned
    if learned:
        em = (em or EMOptions()).resolved(
            num_steps, exact, _CHUNK, schedule.objective.expectation_of_log_density
        )
        space = ParamSpace(schedule.graph, learned)
        mstep = structural_jit(m_step(algorithm, space, exact, em))
        move = structural_jit(algorithm.move_params, runs_once=True)
    restarts = None
    if batch_restarts is None:
        batch_restarts = jax.default_backend() != "cpu"
    if batch_restarts and num_restarts > 1 and not learned and init_state is None:
        restarts = vmapped_restarts(
            algorithm,
            _vmapped_chunk_runner(algorithm.step, tol, exact, subsampled, track),
            restart_keys(rng_key, num_restarts),
            num_steps,
            exact,
            shift=shift,
            estimator=estimator,
            progress_bar=progress_bar,
        )
    # The sequential loop: one restart, variational EM (its M-steps are per restart), a
    # resumed fit, or a model whose programs have no batching rule (restarts is None).
    runs = [] if restarts is None else restarts.runs
    for k in range(max(1, num_restarts) if restarts is None else 0):
        key = rng_key if k == 0 else jax.random.fold_in(rng_key, k)
        state = init(key) if init_state is None else _for_new_data(init_state)
        # A resumed fit may legitimately not move (it started at the optimum).
        initial = state.natural if init_state is None else None
        trace = None
        if not learned:
            state, elbos, converged, wall, steps = run_loop(
                algorithm.step,
                state,
                num_steps,
                tol,
                exact,
                progress_bar=progress_bar,
                subsampled=subsampled,
                runner=runner,
                shift=shift,
                origin=None if shift is None else state.natural,
            )
        else:

            def e_step(state, max_steps):
                return run_loop(
                    algorithm.step,
                    state,
                    max_steps,
                    tol,
                    exact,
                    subsampled=subsampled,
                    runner=runner,
                    shift=shift,
                    origin=None if shift is None else state.natural,
                )

            state, elbos, converged, wall, steps, trace = run_em(
                e_step, mstep, move, state, jax.random.fold_in(key, 7), space, exact, em
            )
        if converged and not exact:
            # Monte Carlo messages leave the iterates jittering around the fixed
            # point; their average over 2 * WINDOW more iterations (Polyak-Ruppert
            # averaging, in natural parameters) is a far less noisy answer.
            state = _chunk_average(runner, state)
        elbo_final = (
            float(elbos[-1]) if exact else final_elbo(algorithm, state, estimator=estimator)
        )
        runs.append((elbo_final, state, elbos, converged, wall, initial, steps, trace))
    best = best_restart([r[0] for r in runs])
    elbo_final, state, elbos, converged, wall, initial, steps, trace = runs[best]
    if restarts is None:
        wall = sum(r[4] for r in runs)
    else:
        # The vmapped restarts' states stay batched until the best one is known.
        state, initial = _restart(restarts.state, best), _restart(restarts.initial, best)
        wall = restarts.wall
    diagnostics = diagnose_schedule(
        schedule, elbos, initial, state.natural, exact, subsampled, steps
    )
    if diagnostics.late_non_finite_elbo:
        diagnostics.non_finite_terms = _non_finite_terms(
            algorithm, schedule, state, jax.random.fold_in(rng_key, 11)
        )
    if trace is not None:
        trace.excuse_boundaries(diagnostics, elbos)
    report(diagnostics, elbos.size)
    if trace is not None and not trace.settled and diagnostics.trustworthy:
        warnings.warn(
            f"variational EM for the params {', '.join(learned)} did not settle in "
            f"{trace.rounds} rounds (EMOptions.max_rounds): the learned values are not "
            "converged; raise max_rounds or resume with init_state=result.state.",
            FitWarning,
            stacklevel=2,
        )
    elif not converged and diagnostics.trustworthy and tol > 0:
        climbing = ""
        if exact and still_climbing(elbos.tolist(), tol):
            n = min(elbos.size, LONG_WINDOW)
            climbing = (
                f"; it still rose by {elbos[-1] - elbos[-n]:.3g} over the last {n} "
                "iterations, slowly: an iteration that creeps towards its optimum"
            )
        elif not exact and schedule.step_size_decay > 0:
            climbing = (
                f"; the global steps decay as (1 + t)^-{schedule.step_size_decay:g} "
                "(step_size_decay), and the faster they decay the more iterations q needs "
                "to reach its fixed point (a minibatched global Gaussian with "
                "site memory keeps a constant step)"
            )
        warnings.warn(
            f"the stopping rule was not met in num_steps = {num_steps} iterations (last ELBO "
            f"{elbos[-1]:.6g}{climbing}): the fit is not converged; pass a larger num_steps "
            "or resume with init_state=result.state.",
            FitWarning,
            stacklevel=2,
        )
    params = {
        **{k: np.asarray(v) for k, v in schedule.params.items()},
        **{k: np.asarray(v) for k, v in state.params.items()},
    }
    return _finished(
        model,
        data,
        schedule,
        state,
        elbos,
        converged and diagnostics.trustworthy,
        wall,
        diagnostics,
        elbo_final,
        np.asarray([r[0] for r in runs]),
        params,
        trace,
        rng_key,
        check,
        importance,
    )


def _non_finite_terms(algorithm, schedule: Schedule, state, rng_key) -> list[str]:
    """The ELBO's terms that are not finite at ``state`` (``CVIAlgorithm.elbo_terms``),
    each factor named with its kind, site and distribution: where a fit whose ELBO stayed
    non-finite broke. [] when every term is finite or they cannot be evaluated."""
    if algorithm.elbo_terms is None:
        return []
    try:
        terms = structural_jit(algorithm.elbo_terms, runs_once=True)(state, rng_key)
    except Exception:  # noqa: BLE001 - a diagnosis only: the warning falls back to its hint
        return []
    factors = schedule.graph.factors
    members = {m for g in schedule.joint for m in g.member_names}
    jacobians = {f"{g.name}:log|J|": g.name for g in schedule.joint}
    out = []
    for name, value in terms.items():
        if np.isfinite(np.asarray(value)).all():
            continue
        f = factors.get(name)
        if name in jacobians:
            what = f"the log-Jacobian of {jacobians[name]}'s map to its members' supports"
        elif f is not None and f.site in members:  # a joint group's member: its prior
            what = f"the prior of {f.site!r} ({f.distribution})"
        elif f is not None:
            what = f"the {f.kind} of {f.site!r} ({f.distribution})"
        else:
            what = name
        out.append(f"{what}: {float(value)}")
    return out


def _finished(
    model,
    data,
    schedule,
    state,
    elbos,
    converged,
    wall,
    diagnostics,
    elbo_final,
    restart_elbos,
    params,
    em,
    rng_key,
    check,
    importance=True,
) -> FitResult:
    """The :class:`FitResult` of a finished run: q per site, and the after-fit checks of
    q (``check``; without the importance check unless ``importance``) into
    ``diagnostics``."""
    posterior = posterior_of(schedule, state)
    if check:
        _check_q(model, data, schedule, posterior, params, diagnostics)
        if importance:
            _check_importance(model, data, schedule, params, state.natural, rng_key, diagnostics)
    return FitResult(
        posterior=LeafExplainingDict(posterior, schedule.leaves),
        elbo=elbos,
        graph=schedule.graph,
        schedule=schedule,
        state=state,
        converged=converged,
        num_steps=int(elbos.size),
        wall_time=wall,
        diagnostics=diagnostics,
        elbo_final=elbo_final,
        restart_elbos=restart_elbos,
        params=params,
        em=em,
        _layouts={n: node.layout for n, node in schedule.nodes.items()},
        _model=model,
        _data=data,
    )


def _check_q(model, data, schedule, posterior, params, diagnostics):
    """The coupling check of q against the posterior (``fit``'s ``check``; the importance
    check is :func:`_check_importance`), into ``diagnostics``, with its warnings. Only where
    the posterior is q's target: the beta-ELBO and DLM aim elsewhere by design (a tempered
    or loss-calibrated q)."""
    if not schedule.objective.is_elbo:
        return
    fitted = schedule.fitted_model or model  # without the leaves q does not hold
    diagnostics.couplings = mean_field_couplings(fitted, data or {}, schedule, posterior, params)
    warn_mean_field_coupling(diagnostics.couplings)


def _check_importance(model, data, schedule, params, natural, rng_key, diagnostics):
    """The importance check of q (``fit``'s ``check``; :mod:`autocvi.infer.importance`)
    into ``diagnostics``, with its warning; ELBO only, as :func:`_check_q`."""
    if not schedule.objective.is_elbo:
        return
    fitted = schedule.fitted_model or model
    key = jax.random.fold_in(rng_key, _IMPORTANCE_KEY)
    diagnostics.importance = check_importance(
        fitted, data or {}, schedule, _guide_of(schedule), natural, params, key
    )
    warn_importance(diagnostics.importance)


def _fit_by_gradient(
    model,
    data,
    optimizer,
    *,
    num_steps,
    rng_key,
    tol,
    init_state,
    progress_bar,
    structure,
    init_strategy,
    check,
    **planner_options,
) -> FitResult:
    """:func:`fit` with ``optimizer``: q trained by gradient steps on the objective
    (:mod:`autocvi.infer.gradient_training`)."""
    if optimizer is None:
        raise ValueError(
            "init_state is a gradient-trained fit's state: pass the optimizer it was trained "
            "with (optimizer=...) to resume it."
        )
    if num_steps is None:
        raise ValueError(
            "optimizer= runs exactly num_steps steps (it has no stopping rule of its own, as "
            "SVI has none): pass num_steps."
        )
    if num_steps < 1:
        raise ValueError(f"num_steps must be at least 1, got {num_steps}")
    if planner_options.get("gaussian_blocks"):
        raise ValueError(
            "optimizer= trains each Gaussian latent's mean and Cholesky factor, so it keeps "
            "them as dense natural parameters: drop gaussian_blocks=True."
        )
    if init_state is not None and not isinstance(init_state, GradientState):
        raise ValueError(
            "init_state is a CVI fit's state; optimizer= resumes only a state it trained "
            "(result.state of a fit with optimizer=)."
        )
    schedule = plan(
        model,
        data,
        structure=structure,
        init_strategy=init_strategy,
        **{**planner_options, "gaussian_blocks": False},
    )
    if schedule.learned:
        raise NotImplementedError(
            f"optimizer=: the params {', '.join(schedule.learned)} would be learned, and "
            "gradient training holds q's parameters only: pass learn_params=False (or "
            "fixed_params=...), or fit without optimizer= (variational EM)."
        )
    gradient_training.check_trainable(schedule)
    exact = schedule.deterministic
    if tol is None:
        tol = 1e-6 if exact else 1e-4
    algorithm = cvi(schedule)
    base = structural_jit(algorithm.init, runs_once=True)(rng_key)
    families = {n: node.layout.q_family for n, node in schedule.nodes.items()}
    state = init_state
    if state is None:
        state = structural_jit(
            lambda natural, key: gradient_training.init(optimizer, families, natural, key),
            runs_once=True,
        )(base.natural, jax.random.fold_in(rng_key, 3))
    runner = gradient_training.chunk_runner(optimizer, families, algorithm.elbo, exact)
    start = time.perf_counter()
    state, values = gradient_training.run(runner, state, base, num_steps, progress_bar)
    at = base._replace(natural=state.natural)
    elbo_final = float(
        structural_jit(algorithm.elbo, runs_once=True)(at, jax.random.fold_in(rng_key, 1))
        if exact
        else elbo_estimator(algorithm)(at)
    )
    wall = time.perf_counter() - start
    elbos = np.append(values[1:], elbo_final) if exact else values
    layouts = {n: node.layout for n, node in schedule.nodes.items()}
    diagnostics = diagnose(
        elbos, base.natural if init_state is None else None, state.natural, layouts, {}, False, True
    )
    report(diagnostics, elbos.size)
    tenth = max(1, elbos.size // 10)
    converged = False
    if tol > 0 and elbos.size >= 2 * tenth:
        last, before = np.mean(elbos[-tenth:]), np.mean(elbos[-2 * tenth : -tenth])
        converged = bool(abs(last - before) <= tol * abs(last))
        if not converged and diagnostics.trustworthy:
            warnings.warn(
                f"the objective's mean over the last {tenth} of the optimizer's "
                f"{elbos.size} steps moved by {last - before:.3g} from the {tenth} before "
                f"(tol = {tol:g}, relative): the fit is not converged; pass a larger "
                "num_steps or resume with init_state=result.state.",
                FitWarning,
                stacklevel=3,
            )
    params = {k: np.asarray(v) for k, v in schedule.params.items()}
    return _finished(
        model,
        data,
        schedule,
        state,
        elbos,
        converged and diagnostics.trustworthy,
        wall,
        diagnostics,
        elbo_final,
        np.asarray([elbo_final]),
        params,
        None,
        rng_key,
        check,
    )


class LeafExplainingDict(dict):
    """``FitResult.posterior``: a dict of q's sites whose missing keys that are leaves of
    the model (:mod:`autocvi.analysis.leaves`) say where their draws are."""

    def __init__(self, posterior: dict, leaves: tuple = ()):
        super().__init__(posterior)
        self.leaves = tuple(leaves)

    def __missing__(self, name):
        if name in self.leaves:
            raise KeyError(
                f"{name!r} is read by no factor but its own density, so q holds it at its "
                f"prior conditional given the other latents, exactly, and has no "
                f"distribution of its own for it: draw it with "
                f"result.sample(key, n)[{name!r}] (or Predictive with result's guide)"
            )
        raise KeyError(name)


# Folded into rng_key for the draws of the importance check (not the fit's own draws).
_IMPORTANCE_KEY = 0x5A7E

# Iterations per compiled chunk; the convergence window (kept under its old
# name for the benchmarks' drivers).
_CHUNK = 20
_WINDOW = WINDOW
# A fit's final iterate average is one chunk (:func:`_chunk_average`).
assert _CHUNK == 2 * _WINDOW
# Largest move of any coordinate's mean of a Gaussian q with estimated messages,
# in its posterior sds, between two successive chunks' averages, that may be
# called converged (Monte Carlo jitter of the averages stays well below it).
MOVE_LIMIT = 0.25
# Largest relative change of any such coordinate's sd between the same averages: a
# minibatched DLM fit's sds (their precision step is CVI's, damped) still grew by 13% a
# chunk where its means moved 0.05 sd, and stopping there left them 14% short.
SD_MOVE_LIMIT = 0.05


def run_loop(
    step,
    state,
    num_steps: int,
    tol: float,
    deterministic: bool,
    progress_bar=False,
    subsampled: bool = False,
    runner=None,
    shift=None,
    origin=None,
):
    """Run ``step`` up to ``num_steps`` times or to convergence.

    ``runner``: an already compiled chunk runner (:func:`_chunk_runner`) to
    reuse instead of building one from ``step`` (``CVI`` caches its own).
    ``shift``: with a runner that tracks q (``track=_natural``, :func:`gaussian_shift`), the
    measure of how far q moved between two chunks; convergence also needs it
    below ``MOVE_LIMIT``. ``origin``: with ``shift``, the tracked record of the starting
    state (its natural parameters), from which the transient left by decaying steps is
    bounded (:func:`transient_left`); convergence also needs that below ``MOVE_LIMIT``.

    Iterations run inside a compiled ``lax.scan``, ``_CHUNK`` at a time; the
    convergence test (:func:`autocvi.infer.convergence.converged_now`) runs
    inside it too and freezes the state once met, so the result is the same as
    stepping one iteration at a time.

    Returns:
        ``(state, elbo, converged, seconds, steps)``; ``elbo`` has one entry per
        iteration run, non-finite values included (as -inf or NaN); ``steps`` is
        a :class:`StepLog`.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be at least 1, got {num_steps}")
    run_chunk = (
        runner if runner is not None else _chunk_runner(step, tol, deterministic, subsampled)
    )
    log = _RunLog()
    start = time.perf_counter()
    bar = None
    if progress_bar and num_steps > 1:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_steps, desc="CVI", leave=False)
    history = _empty_history()
    previous = None
    while len(log.elbos) < num_steps and not log.converged:
        remaining = np.asarray(num_steps - len(log.elbos), np.int32)
        state, history, values, done, steps, mean = run_chunk(
            state, history, remaining, np.asarray(log.hold, np.int32)
        )
        moved = left = None
        if shift is not None and previous is not None:
            moved = functools.partial(shift, mean, previous)
        if shift is not None and origin is not None:
            left = functools.partial(transient_left, shift, origin, mean, log.sizes)
        ran = _record_chunk(log, values, done, steps, moved, _climb_tol(run_chunk), left)
        previous = mean
        if bar is not None:
            bar.update(ran)
            if log.elbos:
                bar.set_postfix_str(f"elbo {log.elbos[-1]:.4f}")
        if ran == 0:
            break
    if bar is not None:
        bar.close()
    elbos, converged, steps = log.elbos, log.converged, log.step_log()
    return state, np.asarray(elbos), converged, time.perf_counter() - start, steps


class StepLog(NamedTuple):
    """Per node, per iteration run: the step size taken (0: refused), the halvings, and
    whether its incoming message was not finite (:class:`~autocvi.engine.step.CVIInfo`)."""

    step_sizes: dict
    halvings: dict
    non_finite: dict = {}


def restart_keys(rng_key, num_restarts: int):
    """The restarts' keys, stacked: restart 0 starts from ``rng_key``, restart ``k`` from
    ``fold_in(rng_key, k)`` (the keys of the sequential loop, so a restart's fit does not
    depend on how many run beside it)."""
    keys = [rng_key] + [jax.random.fold_in(rng_key, k) for k in range(1, num_restarts)]
    return jnp.stack(keys)


def best_restart(elbo_finals) -> int:
    """Index of the restart ``fit`` keeps: the best final ELBO, non-finite ones last
    (among equals the first)."""
    finite = [k for k, v in enumerate(elbo_finals) if np.isfinite(v)]
    return max(finite or range(len(elbo_finals)), key=lambda k: elbo_finals[k])


def _restart(batched, k: int):
    """Restart ``k``'s slice of a pytree batched over restarts."""
    return jax.tree_util.tree_map(lambda x: x[k], batched)


class Restarts(NamedTuple):
    """:func:`vmapped_restarts`' outcome. ``runs``: per restart, the tuple of ``fit``'s
    sequential loop with ``state`` and ``initial`` None (they are in the batched ``state``
    and ``initial``, sliced once the best restart is known); ``wall``: the batched loop's
    seconds."""

    runs: list
    state: CVIState
    initial: dict
    wall: float


def vmapped_restarts(
    algorithm,
    runner,
    keys,
    num_steps: int,
    exact: bool,
    shift=None,
    estimator=None,
    progress_bar: bool = False,
) -> Restarts | None:
    """``fit``'s restarts as one ``jax.vmap``: the chunk loop, the final iterate
    averaging and the final ELBO each run once for every restart.

    Same results as the sequential loop up to rounding: the same keys and starts, and
    the restarts do not interact (a finished restart is frozen while the others go on).
    One program call per chunk for all restarts instead of one per restart. On one CPU
    core it is not faster for the zoo's mixtures: vmap's batching pass over the step
    (traced anew at every fit), a larger program to compile, ``lax.cond``s of the step
    that run both branches once batched, and frozen restarts that still compute cost
    more than the saved calls (iris mixture: 11.2 against 10.0 s cold, 0.74 against
    0.47 s warm), so ``fit`` vmaps its restarts on CPU only when asked
    (``batch_restarts=True``). ``runner``: a :func:`_vmapped_chunk_runner`. None when a program
    cannot be vmapped (a primitive without a batching rule raises NotImplementedError
    while it is traced): ``fit`` then runs the restarts one after another.
    """
    try:
        state = _stacked_inits(algorithm, keys)
        initial = state.natural
        state, logs, wall = run_restarts_loop(
            runner, state, num_steps, shift=shift, progress_bar=progress_bar
        )
        converged = np.asarray([log.converged for log in logs])
        if converged.any() and not exact:
            # Polyak-Ruppert averaging of the converged restarts, as fit's loop does.
            state = _chunk_average_where(runner, state, converged)
        if exact:
            elbo_finals = [float(log.elbos[-1]) for log in logs]
        else:
            mean_elbo = structural_jit(jax.vmap(estimator.__wrapped__), runs_once=True)
            elbo_finals = np.asarray(mean_elbo(state), dtype=float).tolist()
    except NotImplementedError:  # no batching rule: "Batching rule for '...' not implemented"
        return None
    runs = [
        (v, None, np.asarray(log.elbos), log.converged, wall, None, log.step_log(), None)
        for v, log in zip(elbo_finals, logs)
    ]
    return Restarts(runs, state, initial, wall)


def _stacked_inits(algorithm, keys):
    """Every restart's start, stacked on axis 0: ``fit``'s compiled init run once per key,
    not vmapped. The start is run once; vmapping it cost more to trace and compile than
    it saved (iris mixture: 2.9 against 2.2 s cold, 0.24 against 0.18 s warm), and its
    starts are then the sequential loop's bit for bit."""
    init = structural_jit(algorithm.init, runs_once=True)
    starts = [init(key) for key in keys]
    stack = structural_jit(lambda *s: jax.tree_util.tree_map(_stack, *s), runs_once=True)
    return stack(*starts)


def _stack(*xs):
    return jnp.stack(xs)


@dataclass
class _RunLog:
    """What :func:`run_loop` keeps of a run, and :func:`run_restarts_loop` of each
    restart: ELBOs, step sizes, the convergence hold."""

    elbos: list = field(default_factory=list)
    sizes: dict = field(default_factory=dict)
    halvings: dict = field(default_factory=dict)
    non_finite: dict = field(default_factory=dict)
    hold: int = 0
    converged: bool = False
    finished: bool = False

    def step_log(self) -> StepLog:
        return StepLog(
            {n: np.asarray(v, float) for n, v in self.sizes.items()},
            {n: np.asarray(v, int) for n, v in self.halvings.items()},
            {n: np.asarray(v, bool) for n, v in self.non_finite.items()},
        )


def run_restarts_loop(runner, state, num_steps: int, shift=None, progress_bar=False):
    """:func:`run_loop` for a batch of restarts (``state`` batched on axis 0) run by a
    vmapped chunk runner; each restart keeps its own count, ELBOs, hold and convergence.

    A restart that has finished (converged, or ``num_steps`` run) gets ``remaining = 0``:
    the runner freezes it while the others go on, so its trajectory is the one
    ``run_loop`` gives it alone.

    Returns:
        ``(state, logs, seconds)``: ``logs`` one :class:`_RunLog` per restart.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be at least 1, got {num_steps}")
    size = jax.tree_util.tree_leaves(state)[0].shape[0]
    logs = [_RunLog() for _ in range(size)]
    start = time.perf_counter()
    bar = None
    if progress_bar and num_steps > 1:
        from tqdm.auto import tqdm

        bar = tqdm(total=size * num_steps, desc=f"CVI ({size} restarts)", leave=False)
    history = _empty_history(size)
    previous = None
    origin = None if shift is None else state.natural
    while not all(log.finished for log in logs):
        remaining = [0 if log.finished else num_steps - len(log.elbos) for log in logs]
        hold = [log.hold for log in logs]
        state, history, values, done, steps, mean = runner(
            state, history, np.asarray(remaining, np.int32), np.asarray(hold, np.int32)
        )
        values, done = np.asarray(values), np.asarray(done)
        steps = jax.tree_util.tree_map(np.asarray, steps)
        for k, log in enumerate(logs):
            if not log.finished:
                moved = left = None
                if shift is not None and previous is not None:
                    moved = functools.partial(_restart_shift, shift, mean, previous, k)
                if shift is not None:
                    left = functools.partial(
                        transient_left, shift, _restart(origin, k), _restart(mean, k), log.sizes
                    )
                ran = _record_chunk(
                    log, values[k], done[k], _restart(steps, k), moved, _climb_tol(runner), left
                )
                log.finished = log.converged or ran == 0 or len(log.elbos) >= num_steps
                if bar is not None:
                    bar.update(ran)
        previous = mean
        if bar is not None:
            bar.set_postfix_str(f"best elbo {max(log.elbos[-1] for log in logs if log.elbos):.4f}")
    if bar is not None:
        bar.close()
    return state, logs, time.perf_counter() - start


def _climb_tol(runner):
    """The ``tol`` of a chunk runner's deterministic rule, for the host's check of a slow
    climb (:func:`autocvi.infer.convergence.still_climbing`); None for other runners."""
    return getattr(runner, "climb_tol", None)


def _record_chunk(log, values, done, steps, moved=None, climb_tol=None, left=None) -> int:
    """One run's chunk (the chunk runner's outputs, unbatched) into ``log``; returns the
    iterations it ran. ``moved``: None, or ``() -> how far q's chunk-averaged means moved
    since the previous chunk`` (:func:`gaussian_shift`), called only when it decides.
    ``climb_tol``: a deterministic rule's ``tol``, with which a stop is checked against
    the last ``LONG_WINDOW`` ELBOs (:func:`autocvi.infer.convergence.still_climbing`).
    ``left``: None, or ``() -> the transient the steps taken so far may have left``
    (:func:`transient_left`), called only when it decides."""
    values, done = np.asarray(values), np.asarray(done)
    # Inactive iterations report NaN; active ones a finite ELBO or -inf.
    ran = int(np.sum(~np.isnan(values)))
    log.elbos.extend(float(v) for v in values[:ran])
    step_sizes, halvings, non_finite = steps
    for n, b in step_sizes.items():
        log.sizes.setdefault(n, []).extend(np.asarray(b)[:ran].tolist())
        log.halvings.setdefault(n, []).extend(np.asarray(halvings[n])[:ran].tolist())
    for n, bad in non_finite.items():
        log.non_finite.setdefault(n, []).extend(np.asarray(bad)[:ran].tolist())
    log.converged = ran > 0 and bool(done[ran - 1])
    if log.converged and moved is not None:
        # The ELBO can sit on a plateau while q still drifts along it (a funnel's
        # neck, a saddle): converged only if q's means, averaged over this chunk,
        # stayed within MOVE_LIMIT sd of the previous chunk's. Otherwise run a whole
        # chunk before the rule may stop again.
        if float(moved()) > MOVE_LIMIT:
            log.converged = False
            log.hold = _CHUNK
    if log.converged and left is not None and left() > MOVE_LIMIT:
        # Steps that decay fast (Robbins-Monro, step_size_decay near 1) move q so little
        # per chunk that it looks settled while still on its way: a minibatched logistic
        # regression (N = 2,000, B = 100, site_memory=False, decay 0.9) stopped after 46
        # iterations 0.9 sd short, its bias across seeds 0.8 sd. A whole chunk more.
        log.converged = False
        log.hold = _CHUNK
    if log.converged and climb_tol is not None and still_climbing(log.elbos, climb_tol):
        # Still climbing towards a limit above tol (a creeping deterministic fit): a whole
        # chunk more before the rule may stop again.
        log.converged = False
        log.hold = _CHUNK
    return ran


def transient_left(shift, origin, mean, sizes) -> float:
    """A lower bound on how far, in ``shift``'s units (posterior sds), q may still be from
    its fixed point after the steps taken so far: ``P / (1 - P)`` times how far it moved
    from ``origin``, ``P = prod_t (1 - beta_t)`` over the step sizes each node of
    ``shift.nodes`` took (the largest over them).

    A damped step ``lam <- (1 - beta) lam + beta lam_target`` that contracted to the fixed
    point ``lam*`` as fast as its size allows leaves ``lam_t - lam* = P (lam_0 - lam*)``,
    so ``lam* - lam_t = P / (1 - P) (lam_t - lam_0)``. A constant step makes ``P`` vanish
    within a few chunks; ``beta_t = beta_0 / (1 + t)`` leaves ``P ~ t^-beta_0``, which
    the stopping rule must not call settled. Contraction can only be slower, so this is
    what is left at least."""
    worst = 0.0
    for name in shift.nodes:
        taken = np.clip(np.asarray(sizes.get(name, ()), float), 0.0, 1.0)
        if taken.size == 0:
            continue
        # log P; a full step (beta = 1) ends the transient
        log_p = np.sum(np.log1p(-np.minimum(taken, 1.0 - 1e-12)))
        p = float(np.exp(log_p))
        worst = max(worst, p / max(1.0 - p, 1e-12))
    if worst == 0.0:
        return 0.0
    return worst * float(shift(origin, mean))


def _restart_shift(shift, mean, previous, k):
    return shift(_restart(mean, k), _restart(previous, k))


def _chunk_average_where(runner, state, mask):
    """:func:`_chunk_average` for the restarts where ``mask`` holds, by the vmapped chunk
    runner; the others get ``remaining = 0`` (frozen) and keep their natural parameters."""
    size = mask.shape[0]
    history = _empty_history(size)
    remaining = np.asarray(np.where(mask, _CHUNK, 0), np.int32)
    hold = np.full((size,), _CHUNK, np.int32)
    state, *_, mean = runner(state, history, remaining, hold)
    keep = jnp.asarray(mask)

    def pick(m, n):
        return jnp.where(keep.reshape((size,) + (1,) * (n.ndim - 1)), m, n)

    return state._replace(natural=jax.tree_util.tree_map(pick, mean, state.natural))


def final_elbo(algorithm, state, num_estimates: int = 64, estimator=None) -> float:
    """The ELBO of q at ``state`` (see ``FitResult.elbo_final``): the mean of
    ``num_estimates`` estimates.

    ``estimator``: a compiled ``elbo_estimator(algorithm, num_estimates)`` to reuse
    (restarts).
    """
    return float((estimator or elbo_estimator(algorithm, num_estimates))(state))


def elbo_estimator(algorithm, num_estimates: int = 64):
    """Compiled ``state -> mean of num_estimates ELBO estimates`` (keys from the state's).

    ``lax.map``, not ``vmap``: the batched program compiled up to 1.7x longer (2.2
    against 1.3 s on eight schools) and ran no faster on the zoo's models.
    """

    def mean_estimate(state):
        keys = jax.random.split(jax.random.fold_in(state.rng_key, 1), num_estimates)
        return jnp.mean(jax.lax.map(lambda key: algorithm.elbo(state, key), keys))

    return structural_jit(mean_estimate, runs_once=True)


def _for_new_data(state):
    """A resumed state whose Gaussian blocks' cached line-search trials
    (``CVIState.block_cache``) match no sites (the data may be new) and hold no
    Anderson history; the step size last accepted is kept (set to NaN with the rest, it
    made the resumed fit's first step NaN, refused: a run resumed k times lost k steps)."""

    def forget(cache):
        nan = jax.tree_util.tree_map(lambda x: jnp.full_like(x, jnp.nan), cache)
        return {**nan, "step": cache["step"], "count": jnp.zeros_like(cache["count"])}

    return state._replace(block_cache={n: forget(c) for n, c in state.block_cache.items()})


def _natural(state):
    return state.natural


def _empty_history(*restarts: int):
    """The chunk runner's ELBO history before the first chunk (NaN), per restart.

    Every caller of a chunk runner starts from this one value: numpy, so that no eager
    jnp op compiles a program of its own, and of one type (strong float), because a
    weakly typed history (``jnp.full(..., jnp.nan)``) is another input signature, and the
    whole loop program would be compiled again for it."""
    return np.full((*restarts, 2 * _WINDOW), np.nan, jnp.result_type(float))


def _chunk_average(runner, state):
    """:func:`average_iterates` over ``2 * _WINDOW`` iterations, run by a chunk runner
    built with ``track=_natural`` (one chunk, held from stopping), so no second
    program with the step inside is compiled."""
    chunk = np.asarray(_CHUNK, np.int32)
    state, *_, mean = runner(state, _empty_history(), chunk, chunk)
    return state._replace(natural=mean)


def average_iterates(step, state, num_steps: int, averager=None):
    """``num_steps`` more iterations; the state's natural parameters become their mean.

    Averaging natural parameters is averaging the exponential-family
    distributions' log densities (up to normalisation), which stays inside
    every family's domain (the domains are convex). ``averager``: a compiled
    ``iterate_averager(step, num_steps)`` to reuse (restarts).
    """
    return (averager or iterate_averager(step, num_steps))(state)


def iterate_averager(step, num_steps: int):
    """Compiled ``state -> state`` of :func:`average_iterates`."""

    @structural_jit
    def run(state):
        def body(carry, _):
            state, total = carry
            state, _ = step(state)
            total = jax.tree_util.tree_map(jnp.add, total, state.natural)
            return (state, total), None

        zero = jax.tree_util.tree_map(jnp.zeros_like, state.natural)
        (state, total), _ = jax.lax.scan(body, (state, zero), None, num_steps)
        mean = jax.tree_util.tree_map(lambda t: t / num_steps, total)
        return state._replace(natural=mean)

    return run


def _chunk_runner(step, tol: float, exact: bool, subsampled: bool = False, track=None):
    """A jitted ``(state, history, remaining, hold) -> (state, history, elbos, done, steps,
    mean)``.

    Runs ``_CHUNK`` iterations in a ``lax.scan``. After convergence (or after
    ``remaining`` iterations) the state is frozen and the reported ELBO is NaN;
    an iteration that ran reports its ELBO, or -inf when it was not finite.
    ``history`` holds the last ``2 * _WINDOW`` ELBOs across chunks; the rule is
    :func:`autocvi.infer.convergence.converged_now`, which may stop the chunk
    only after ``hold`` iterations. ``steps``: the iterations'
    ``(step_sizes, halvings, non_finite)`` per node (:class:`~autocvi.engine.step.CVIInfo`).
    ``mean``: ``track(state)`` averaged over the chunk's iterations (None
    without ``track``).
    """

    scan = _chunk_scan(step, tol, exact, subsampled, track)

    @structural_jit
    def run(state, history, remaining, hold):
        total = None
        if track is not None:
            total = jax.tree_util.tree_map(jnp.zeros_like, track(state))
        zero = jnp.zeros((), jnp.int32)
        return scan(state, history, remaining, hold, zero, jnp.zeros((), bool), total)

    run.climb_tol = tol if exact and tol > 0 else None  # the host's check (_record_chunk)
    return run


def _vmapped_chunk_runner(step, tol: float, exact: bool, subsampled: bool = False, track=None):
    """:func:`_chunk_runner` over a batch of restarts: every argument and result batched
    on axis 0, one ``jax.vmap`` of the same scan.

    The scan's counters and running total start batched (zeros made outside the vmap): a
    carry that enters unbatched and leaves batched makes ``vmap`` batch the whole scan
    body a second time, at every fit (the body is traced anew with each fit's model).
    """
    scan = jax.vmap(_chunk_scan(step, tol, exact, subsampled, track))

    @structural_jit
    def run(state, history, remaining, hold):
        total = None
        if track is not None:
            total = jax.tree_util.tree_map(jnp.zeros_like, track(state))
        count, done = jnp.zeros_like(remaining), jnp.zeros(remaining.shape, bool)
        return scan(state, history, remaining, hold, count, done, total)

    run.climb_tol = tol if exact and tol > 0 else None
    return run


def _chunk_scan(step, tol: float, exact: bool, subsampled: bool, track):
    """The chunk runners' program: ``(state, history, remaining, hold, count, done, total)
    -> (state, history, elbos, done, steps, mean)``, ``_CHUNK`` iterations from the given
    counters (zeros: the runners make them, batched or not)."""

    def body(carry, _):
        state, history, count, remaining, done, hold, total = carry
        new_state, info = step(state)
        active = jnp.logical_and(~done, count < remaining)
        state = jax.tree_util.tree_map(lambda n, o: jnp.where(active, n, o), new_state, state)
        elbo = jnp.where(jnp.isfinite(info.elbo), info.elbo, -jnp.inf)
        value = jnp.where(active, elbo, jnp.nan)
        history = jnp.where(active, jnp.roll(history, -1).at[-1].set(elbo), history)
        conv = converged_now(history, state.iteration, tol, exact, subsampled)
        count = count + active.astype(count.dtype)
        done = jnp.logical_or(done, active & conv & (count >= hold))
        if track is not None:
            total = jax.tree_util.tree_map(
                lambda t, x: t + jnp.where(active, x, 0.0), total, track(state)
            )
        steps = (info.step_sizes, info.halvings, info.non_finite)
        return (state, history, count, remaining, done, hold, total), (value, done, steps)

    def scan(state, history, remaining, hold, count, done, total):
        carry = (state, history, count, remaining, done, hold, total)
        (state, history, count, _, _, _, total), (values, done, steps) = jax.lax.scan(
            body, carry, None, _CHUNK
        )
        mean = None
        if track is not None:
            mean = jax.tree_util.tree_map(lambda t: t / jnp.maximum(count, 1), total)
        return state, history, values, done, steps, mean

    return scan


def gaussian_shift(schedule: Schedule):
    """``shift(a, b)``: how far the means and sds of the Gaussian nodes (not the Gaussian
    blocks) whose messages are estimated moved between two records of natural
    parameters (a chunk runner's averages with ``track=_natural``): the largest
    ``|m_a - m_b| / sd_b`` over every coordinate, or ``|sd_a / sd_b - 1|`` scaled so that
    ``SD_MOVE_LIMIT`` of it counts as ``MOVE_LIMIT``. None without such nodes."""
    names = [
        n
        for n, node in schedule.nodes.items()
        if n not in schedule.blocks
        and node.layout.q_family in ("Normal", "MultivariateNormal")
        and not all(kind == EXACT.name for _, kind in node.incoming)
    ]
    if not names:
        return None

    @structural_jit(runs_once=True)
    def shift(a, b):
        worst = jnp.zeros(())
        for n in names:
            q_family = schedule.nodes[n].layout.q_family
            # from the natural parameters: E[x^2] - E[x]^2 cancels in float32 for a
            # posterior narrow against its mean, and the shift came out 1e9 sd
            m_a, var_a = gaussian_mean_variance(a[n], q_family)
            m_b, var_b = gaussian_mean_variance(b[n], q_family)
            sd = jnp.sqrt(jnp.maximum(var_b, 1e-30))
            sd_a = jnp.sqrt(jnp.maximum(var_a, 1e-30))
            spread = MOVE_LIMIT * jnp.abs(sd_a / sd - 1.0) / SD_MOVE_LIMIT
            worst = jnp.maximum(worst, jnp.max(jnp.maximum(jnp.abs(m_a - m_b) / sd, spread)))
        return worst

    shift.nodes = tuple(names)  # whose step sizes bound the transient (transient_left)
    return shift


class IllConditionedError(ValueError):
    """q's covariance cannot be represented at the working precision."""


def _full_plate_layout(lay, node):
    """``lay`` with every subsampled plate axis at its full size: the state of a local
    latent holds all N elements, the traced layout the minibatch's B."""
    if node is None or not node.subsample_axes:
        return lay
    shape, family_shape = list(lay.shape), list(lay.family_shape)
    for axis, plate in node.subsample_axes:
        shape[axis] = family_shape[axis] = plate.size
    return dataclasses.replace(lay, shape=tuple(shape), family_shape=tuple(family_shape))


def posterior_program(schedule: Schedule):
    """``natural -> (posterior, ok)`` as one compiled program (:func:`posterior_of`'s),
    traced on its first call: a caller that keeps it (``CVI`` keeps one per plan) builds
    later posteriors without tracing again."""
    return structural_jit(lambda natural: _checked_posterior_of(schedule, natural), runs_once=True)


def posterior_of(schedule: Schedule, state, program=None) -> dict:
    """q per latent site of the user's model (joint groups split into their members).

    Built by one compiled program (numpyro Distributions are pytrees): built
    eagerly, each Cholesky, solve and reshape compiles on its own, seconds of a
    cold fit. Where that program cannot be built (a structured ``BlockPosterior``)
    or a parameter is not finite (an ill-conditioned q: the eager build raises the
    error that names the site), the eager build runs. ``program``: a kept
    :func:`posterior_program` of ``schedule`` (else one is traced for this call).
    """
    out, ok = None, False
    # A block above the dense limit answers with a structured BlockPosterior: eager.
    if all(b.dim <= _MAX_DENSE_POSTERIOR for b in schedule.blocks.values()):
        try:
            # NumPyro validates a distribution's arguments even while it is traced, with
            # its constant masks computed eagerly (half a second of small compiles on a
            # cold fit) and nothing checkable on tracers; ``ok`` makes the check instead.
            with numpyro.validation_enabled(False):
                out, ok = (program or posterior_program(schedule))(state.natural)
            out = {k: _default_validation(d) for k, d in out.items()}
        except Exception:  # noqa: BLE001 - not a pytree of arrays: built eagerly below
            out, ok = None, False
    leaves = jax.tree_util.tree_leaves(out)
    if bool(ok) and all(bool(np.all(np.isfinite(np.asarray(x)))) for x in leaves):
        # a compiled program returns dicts in sorted key order: restore the model's
        order = [n for n in schedule.nodes if all(n != g.name for g in schedule.joint)]
        order += [m for g in schedule.joint for m in g.member_names]
        return _with_integrated(schedule, state, {k: out[k] for k in order})
    return _with_integrated(schedule, state, _posterior_of(schedule, state.natural))


def _with_integrated(schedule: Schedule, state, posterior: dict) -> dict:
    """``posterior`` plus q's marginal of every latent integrated into its child
    (:func:`autocvi.analysis.integrate.integrated_marginal`), in the model's order."""
    if not schedule.integrated:
        return posterior
    graph = schedule.user_graph or schedule.graph
    params = {**schedule.params, **getattr(state, "params", {})}
    out = dict(posterior)
    for it in schedule.integrated:
        q = integrated_marginal(graph, it, out, params)
        if q is not None:
            out[it.latent] = q
    order = [n for n in graph.latent_names if n in out]
    return {n: out[n] for n in order + [n for n in out if n not in order]}


def _default_validation(d):
    """``d`` (and the distributions it wraps) validating as NumPyro's current default says."""
    inner = d
    while inner is not None:
        vars(inner).pop("_validate_args", None)  # the class attribute holds the default
        inner = getattr(inner, "base_dist", None)
    return d


def _guide_of(schedule: Schedule):
    """``natural -> CVIGuide``: q as a guide, traceable (the importance check builds it
    inside its compiled program)."""

    def build(natural):
        return CVIGuide(_posterior_of(schedule, natural), joint=joint_posteriors(schedule, natural))

    return build


def _checked_posterior_of(schedule: Schedule, natural):
    """``(posterior_of, ok)``: ``ok`` is False when a Gaussian's precision is not positive
    definite at this precision (the check NumPyro's validation makes eagerly, which the
    eager build turns into :class:`IllConditionedError`)."""
    ok = jnp.asarray(True)
    for n, node in schedule.nodes.items():
        lam = natural[n]
        if n in schedule.blocks:
            lam = schedule.blocks[n].natural(lam)
        elif node.layout.q_family != "MultivariateNormal":
            continue
        precision = -(lam[1] + jnp.swapaxes(lam[1], -1, -2))
        # at unit diagonal, as the posterior is factored (families.mvnormal.to_numpyro)
        s = jnp.sqrt(jnp.abs(jnp.diagonal(precision, axis1=-2, axis2=-1)))
        unit = precision / (s[..., :, None] * s[..., None, :])
        ok = ok & jnp.all(jnp.linalg.eigvalsh(unit)[..., 0] > 0)
    return _posterior_of(schedule, natural), ok


def _posterior_of(schedule: Schedule, natural) -> dict:
    out = {}
    for n, node in schedule.nodes.items():
        lam = natural[n]
        if n in schedule.blocks:
            out[n] = schedule.blocks[n].posterior(lam)
            continue
        try:
            out[n] = site_posterior(node.layout, lam)
        except ValueError as err:
            raise _ill_conditioned(n, lam) from err
    for group in schedule.joint:
        out.update(member_posteriors(group, out.pop(group.name)))
    return out
