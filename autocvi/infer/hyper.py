"""Variational EM for ``numpyro.param`` sites: CVI E-steps, M-steps on the dual bound.

A model's ``numpyro.param`` sites (kernel length-scales, noise scales, prior
scales the user wants point estimates of) are learned by alternating

* an **E-step**: CVI iterations with the params held (``fit``'s loop and
  stopping rule, capped at ``e_steps`` iterations per round), and
* an **M-step**: ``m_steps`` optimiser steps on the ELBO as a function of the
  params, with q's *sites* held and the prior moving with the params: Adam,
  Chang, Khan & Solin, *Dual Parameterization of Sparse Variational Gaussian
  Processes* (NeurIPS 2021), Eq. 15 (the engine's ``move_params``). This bound
  touches the marginal likelihood at the E-step's q and is tighter than holding
  q (their Eq. 14), so M-steps can be long; for Gaussian-likelihood GP
  regression it *is* the log marginal likelihood (below their Eq. 17), and one
  round reaches the type-II maximum-likelihood estimate.

The optimiser works on the params' unconstrained values
(``biject_to(constraint)``, as NumPyro's SVI does): L-BFGS (Optax's, with a
zoom line search) when every message is deterministic, Adam otherwise (its
Monte Carlo ELBO takes fresh draws every step). An M-step whose result is not
finite, or (deterministic objectives) lowers the bound, is refused and the
params keep their values.

Deterministic EM stops when an M-step moves no unconstrained param by more
than ``param_tol``, or when the bound's gains per round have shrunk to a sum
(extrapolated) below ``bound_tol`` relative (a param whose optimum is at
infinity, as an irrelevant input's length-scale, never stops moving); with
Monte Carlo messages the params jitter, so it stops
when their mean over the last rounds no longer drifts, and returns that mean
(:func:`run_em`). A last E-step at the final params runs to the loop's stopping
rule; a fit that runs out of rounds, or whose last E-step does not converge,
reports ``converged=False``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to

__all__ = [
    "EMOptions",
    "ParamSpace",
    "MStepInfo",
    "EMTrace",
    "m_step",
    "m_step_memory",
    "run_em",
]


@dataclass(frozen=True)
class EMOptions:
    """How the params are learned (``fit(..., em=EMOptions(...))``).

    Attributes:
        max_rounds: E/M rounds at most.
        e_steps: CVI iterations per E-step at most (the loop's stopping rule
            may end it sooner); None: ``num_steps`` for deterministic
            schedules (each E-step runs to convergence, as in EM), 20 (one
            compiled chunk: a partial E-step, t-SVGP Table 1) otherwise.
        final_steps: CVI iterations at most of the last E-step, at the final
            params (None: ``num_steps``).
        m_steps: optimiser iterations per M-step; None: 100 for L-BFGS (it
            stops sooner when the gradient vanishes), 20 for Adam.
        optimizer: ``"lbfgs"`` or ``"adam"``; None picks L-BFGS when the
            ELBO is deterministic, else Adam.
        learning_rate: Adam's step size on the unconstrained params.
        param_tol: largest change of an unconstrained param in a round that
            counts as settled (None: 1e-4 in float64, 2e-3 in float32, where
            the bound's rounding leaves the optimum defined to about that).
        bound_tol: deterministic EM also settles when the bound's gains per
            round shrink geometrically and their extrapolated sum, from the last
            round on, is below ``bound_tol * (1 + |bound|)`` (None: 1e-5): a
            param whose optimum is at infinity (the length-scale of an input
            that carries nothing) never stops moving while the bound does.
        bound: the M-step's objective: ``"dual"`` (t-SVGP Eq. 15: q's sites
            held, the prior moving with the params) or ``"standard"`` (their
            Eq. 14: q held, the usual variational EM), for comparison. None:
            ``"dual"`` for the ELBO and beta-ELBO; ``"standard"`` for DLM, whose
            reward is not an expected log density, so the dual bound's argument
            does not hold (on a regression with a learned noise scale, the dual
            M-steps ended 0.12% off the DLM optimum after 50 rounds, the standard
            ones on it).
    """

    max_rounds: int = 50
    e_steps: int | None = None
    final_steps: int | None = None
    m_steps: int | None = None
    optimizer: str | None = None
    learning_rate: float = 0.02
    param_tol: float | None = None
    bound_tol: float | None = None
    bound: str | None = None

    def resolved(
        self, num_steps: int, deterministic: bool, chunk: int, expected_log_density: bool = True
    ) -> EMOptions:
        """These options with the defaults that depend on the fit filled in
        (``expected_log_density``: the objective's rewards are expected log densities,
        ``Objective.expectation_of_log_density``)."""
        x64 = jnp.result_type(float) == jnp.float64
        return replace(
            self,
            bound=self.bound or ("dual" if expected_log_density else "standard"),
            e_steps=self.e_steps or (num_steps if deterministic else chunk),
            final_steps=self.final_steps or num_steps,
            param_tol=self.param_tol if self.param_tol is not None else (1e-4 if x64 else 2e-3),
            bound_tol=self.bound_tol if self.bound_tol is not None else 1e-5,
        )


class ParamSpace:
    """The learned params' map between their supports and R^d (``biject_to``)."""

    def __init__(self, graph, names):
        self.names = tuple(names)
        self.transforms = {}
        for n in self.names:
            support = graph.params[n].support
            self.transforms[n] = biject_to(constraints.real if support is None else support)

    def unconstrain(self, values: dict) -> dict:
        return {n: self.transforms[n].inv(jnp.asarray(values[n])) for n in self.names}

    def constrain(self, free: dict) -> dict:
        return {n: self.transforms[n](free[n]) for n in self.names}


class MStepInfo(NamedTuple):
    """One M-step: the bound before and after, whether the new params were kept, and
    how many times the optimiser evaluated the bound and its gradient."""

    before: jax.Array
    after: jax.Array
    accepted: jax.Array
    evaluations: jax.Array


def rounding_slack(dtype) -> float:
    """Relative change of an ELBO that is rounding, not a move: 1e3 ulp (1.2e-4 in
    float32, where a 60-point GP's ELBO scatters by ~5e-5 between two evaluations
    of the same q; 2e-13 in float64)."""
    return 1e3 * float(jnp.finfo(dtype).eps)


def _optimizer(options: EMOptions, deterministic: bool) -> str:
    optimizer = options.optimizer or ("lbfgs" if deterministic else "adam")
    if optimizer not in ("lbfgs", "adam"):
        raise ValueError(f"EMOptions.optimizer must be 'lbfgs' or 'adam', got {optimizer!r}")
    return optimizer


def m_step_memory(space: ParamSpace, params: dict, deterministic: bool, options: EMOptions):
    """What one M-step hands the next: L-BFGS's curvature pairs (empty at the start), or
    nothing (``()``) for Adam, whose Monte Carlo M-steps start afresh each round.

    The M-steps of successive rounds maximise nearly the same bound (the E-step between
    them moves q a little), and each stops at ``m_steps`` evaluations before it has
    converged on the bound of a model with many params (an SVGP's inducing inputs): a
    fresh L-BFGS each round spent its first evaluations relearning the curvature.
    """
    if _optimizer(options, deterministic) != "lbfgs":
        return ()
    x0, _ = ravel_pytree(space.unconstrain(params))
    return optax.scale_by_lbfgs(memory_size=_MEMORY).init(x0)


def m_step(algorithm, space: ParamSpace, deterministic: bool, options: EMOptions):
    """The M-step ``(state, rng_key, memory) -> (state, MStepInfo, memory)``, a pure
    function to jit (``memory``: :func:`m_step_memory`, then what the last M-step returned).

    Maximises ``algorithm.elbo(algorithm.move_params(state, theta), key)``
    over the unconstrained params (t-SVGP Eq. 15: sites held, prior moving).
    """
    optimizer = _optimizer(options, deterministic)
    num = options.m_steps or (100 if optimizer == "lbfgs" else 20)

    if options.bound not in ("dual", "standard"):
        raise ValueError(f"EMOptions.bound must be 'dual' or 'standard', got {options.bound!r}")
    hold_q = options.bound == "standard"

    def bound(free, state, key, sites):
        values = space.constrain(free)
        return algorithm.elbo(algorithm.move_params(state, values, hold_q, sites), key)

    def run(state, key, memory):
        # the sites the dual bound holds depend on the state only: once per M-step
        sites = algorithm.held_sites(state)
        free0 = space.unconstrain(state.params)
        x0, unravel = ravel_pytree(free0)
        # One key for the before/after comparison (common random numbers).
        check_key, key = jax.random.split(key)
        if optimizer == "lbfgs":
            # A deterministic objective: every evaluation uses the same key.
            def loss(x):
                return -bound(unravel(x), state, check_key, sites)

            x, before, after, evaluations, learned = _lbfgs(loss, x0, num, memory)
        else:
            opt = optax.adam(options.learning_rate)
            before = bound(free0, state, check_key, sites)

            def body(carry, k):
                x, opt_state = carry
                grad = jax.grad(
                    lambda x: -bound(unravel(x), state, jax.random.fold_in(key, k), sites)
                )(x)
                updates, opt_state = opt.update(grad, opt_state, x)
                return (optax.apply_updates(x, updates), opt_state), None

            (x, _), _ = jax.lax.scan(body, (x0, opt.init(x0)), jnp.arange(num))
            after = bound(unravel(x), state, check_key, sites)
            evaluations, learned = jnp.asarray(num), memory
        finite = jnp.isfinite(after) & jnp.all(jnp.isfinite(x))
        if deterministic:
            slack = rounding_slack(before.dtype) * (1.0 + jnp.abs(before))
            ok = finite & (after >= before - slack)
        else:
            ok = finite
        free = unravel(jnp.where(ok, x, x0))
        new = algorithm.move_params(state, space.constrain(free), hold_q, sites)
        memory = jax.tree_util.tree_map(lambda n, o: jnp.where(ok, n, o), learned, memory)
        return new, MStepInfo(before, jnp.where(ok, after, before), ok, evaluations), memory

    return run


# Armijo's sufficient-decrease constant and the L-BFGS memory.
_ARMIJO = 1e-4
_MEMORY = 10


def _lbfgs(loss, x0, max_iter: int, memory):
    """Minimise ``loss`` from ``x0`` by L-BFGS with a backtracking line search, its
    curvature pairs starting from ``memory`` (optax's ``scale_by_lbfgs`` state).

    Returns ``(x, -loss(x0), -loss(x), evaluations, memory)``. Optax's
    ``scale_by_lbfgs`` gives the direction; the line search is the loop itself (a
    rejected point halves the step and is evaluated next), so the objective and its
    gradient appear once in the compiled program: optax's ``lbfgs`` with its zoom line
    search compiled the objective three times (11 s of a 67-point GP's 14 s M-step).
    Stops after ``max_iter`` evaluations, when an accepted step changes the loss by
    no more than 10 ulp, or when the step has been halved to nothing.
    """
    opt = optax.scale_by_lbfgs(memory_size=_MEMORY)
    value_and_grad = jax.value_and_grad(loss)
    dtype = x0.dtype
    # A step that changes the loss by 10 ulp or less has converged (1e3 ulp, the ELBO's
    # rounding between evaluations, stopped flat float32 objectives half way).
    tol = 10.0 * float(jnp.finfo(dtype).eps)

    def body(c):
        x, val, grad, direction, step, opt_state, k, _, first, start = c
        cand = x + step * direction
        v, g = value_and_grad(cand)
        good = jnp.isfinite(v) & jnp.all(jnp.isfinite(g))
        accept = good & (first | (v <= val + _ARMIJO * step * jnp.vdot(grad, direction)))
        # The first evaluation, at x0, with pairs from an earlier M-step: optax would pair
        # x0 with where that M-step ended (the same point: s = 0, which zeroes its
        # scaling of the identity); re-enter the last pair instead (a repeated BFGS
        # update changes nothing), so the first direction uses the memory.
        resumed = _resumed(opt_state, cand, g)
        opt_state = jax.tree_util.tree_map(lambda r, o: jnp.where(first, r, o), resumed, opt_state)
        updates, new_state = opt.update(g, opt_state, cand)
        # Restart from the scaled gradient (memory emptied) when the new pair has no
        # positive curvature (s^T y <= 0: a backtracking search does not ensure it on a
        # non-convex bound, and optax keeps such pairs) or the direction is not one of
        # descent (pairs kept from an earlier M-step's bound can mislead): an M-step
        # that cannot descend stops, and EM would call the params settled where they stuck.
        curved = first | (jnp.vdot(cand - x, g - grad) > 0)
        restart = ~curved | (jnp.vdot(g, updates) <= 0)
        fresh_updates, fresh_state = opt.update(g, opt.init(cand), cand)
        updates = jnp.where(restart, fresh_updates, updates)
        new_state = jax.tree_util.tree_map(
            lambda f, n: jnp.where(restart, f, n), fresh_state, new_state
        )
        opt_state = jax.tree_util.tree_map(
            lambda n, o: jnp.where(accept, n, o), new_state, opt_state
        )
        small = accept & ~first & (jnp.abs(val - v) <= tol * (1.0 + jnp.abs(v)))
        return (
            jnp.where(accept, cand, x),
            jnp.where(accept, v, val),
            jnp.where(accept, g, grad),
            jnp.where(accept, -updates, direction),
            jnp.where(accept, jnp.ones((), dtype), 0.5 * step),
            opt_state,
            k + 1,
            small | (step < 1e-8),
            jnp.zeros((), bool),
            jnp.where(first, v, start),
        )

    def cond(c):
        k, done = c[6], c[7]
        return (k < max_iter) & ~done

    zero = jnp.zeros_like(x0)
    init = (
        x0,
        jnp.asarray(jnp.inf, dtype),
        zero,
        zero,
        jnp.ones((), dtype),
        memory,
        0,
        jnp.zeros((), bool),
        jnp.ones((), bool),
        jnp.asarray(jnp.nan, dtype),
    )
    # The first evaluation is at x0 (a zero direction): it is the value before.
    x, val, _, _, _, memory, k, _, _, start = jax.lax.while_loop(cond, body, init)
    return x, -start, -val, k, memory


def _resumed(memory, x, g):
    """``memory`` (optax's L-BFGS state) with its last point and gradient set so that the
    next update at ``(x, g)`` re-enters the last curvature pair (at the start, with no
    pair, the zero pair optax ignores)."""
    last = (memory.count - 1) % _MEMORY
    return memory._replace(
        params=x - memory.diff_params_memory[last],
        updates=g - memory.diff_updates_memory[last],
    )


class EMTrace(NamedTuple):
    """What :func:`run_em` did: per round the M-step's bound and the params after it."""

    rounds: int
    bounds: np.ndarray
    params: list
    refused: int
    # Index in the fit's ELBO trace of each E-step's first iteration.
    starts: tuple = ()
    # The params met their stopping test (before the last E-step).
    settled: bool = False
    # Per round, the M-step's evaluations of the bound and its gradient.
    evaluations: tuple = ()

    def excuse_boundaries(self, diagnostics, elbo) -> None:
        """Drop the rounding-level decreases at E-step starts from ``diagnostics``."""
        noise = set(self.boundary_noise(np.asarray(elbo), jnp.result_type(float)).tolist())
        diagnostics.elbo_decreases = [i for i in diagnostics.elbo_decreases if i not in noise]

    def boundary_noise(self, elbo: np.ndarray, dtype) -> np.ndarray:
        """Rounding-level ELBO drops at the first iteration of an E-step (a new
        param value evaluates q's terms differently; the M-step itself did not
        lower the bound): the indices :func:`autocvi.infer.convergence.diagnose`
        should not count as decreases. ``dtype``: the one the ELBO was computed in."""
        tol = rounding_slack(dtype) * (1.0 + np.abs(elbo))
        idx = [i for i in self.starts if 0 < i < elbo.size and elbo[i - 1] - elbo[i] <= tol[i]]
        return np.asarray(idx, int)


def run_em(e_step, mstep, move, state, rng_key, space, deterministic, options: EMOptions):
    """Alternate E- and M-steps (module docstring).

    Args:
        e_step: ``(state, max_steps) -> (state, elbos, converged, seconds, steps)``,
            CVI with the params held (``fit``'s ``run_loop``).
        mstep: ``(state, key, memory) -> (state, MStepInfo, memory)``, :func:`m_step`
            compiled.
        move: ``(state, values) -> state``, the engine's ``move_params`` compiled.
        state: where to start; rng_key: the M-steps' keys.
        space: the learned params' :class:`ParamSpace`.
        deterministic: every message is deterministic (the ELBO is exact).

    Returns:
        ``(state, elbos, converged, seconds, steps, EMTrace)``. Rounds run
        ``options.e_steps`` CVI iterations; the last E-step, at the final
        params, runs up to ``options.final_steps`` and its stopping rule decides
        ``converged`` together with the params' own test: deterministic EM
        stops when a round moves no unconstrained param by more than
        ``param_tol``; with Monte Carlo messages the params jitter, so the test
        is that the last ``2 * _EM_WINDOW`` rounds, after a burn-in of
        ``_EM_WINDOW``, show no trend (:func:`_no_trend`), and the answer is
        their mean (Polyak-Ruppert
        averaging of the params).
    """
    elbos, steps, wall = [], [], 0.0
    bounds, history, refused, frees, evaluations = [], [], 0, [], []
    converged = False
    starts = []
    memory = m_step_memory(space, state.params, deterministic, options)
    for r in range(options.max_rounds):
        starts.append(sum(e.size for e in elbos))
        state, e_elbos, _, seconds, e_steps = e_step(state, options.e_steps)
        elbos.append(e_elbos)
        steps.append(e_steps)
        wall += seconds
        start = time.perf_counter()
        free_old = _flat(space.unconstrain(state.params), space)
        state, info, memory = mstep(state, jax.random.fold_in(rng_key, r), memory)
        # the call returns before the program has run (JAX dispatches asynchronously)
        state, info = jax.block_until_ready((state, info))
        wall += time.perf_counter() - start
        evaluations.append(int(info.evaluations))
        frees.append(_flat(space.unconstrain(state.params), space))
        bounds.append(float(info.after))
        history.append({n: np.asarray(v) for n, v in state.params.items()})
        refused += int(not bool(info.accepted))
        if deterministic:
            moved = float(np.max(np.abs(frees[-1] - free_old), initial=0.0))
            converged = moved <= options.param_tol or _bound_settled(bounds, options.bound_tol)
        elif len(frees) >= 3 * _EM_WINDOW:  # the first _EM_WINDOW rounds are burn-in
            converged = _no_trend(np.stack(frees[-2 * _EM_WINDOW :]), options.param_tol)
        if converged:
            break
    if not deterministic and len(frees) >= 2:
        # The params' average over the last rounds (their Monte Carlo jitter averages out).
        mean = np.mean(np.stack(frees[-2 * _EM_WINDOW :]), axis=0)
        state = move(state, space.constrain(_unflat(mean, space, state.params)))
    # A last E-step at the final params, so q is the one they imply.
    starts.append(sum(e.size for e in elbos))
    state, e_elbos, e_converged, seconds, e_steps = e_step(state, options.final_steps)
    elbos.append(e_elbos)
    steps.append(e_steps)
    wall += seconds
    settled, converged = converged, converged and e_converged
    trace = EMTrace(
        len(frees), np.asarray(bounds), history, refused, tuple(starts), settled, tuple(evaluations)
    )
    return state, np.concatenate(elbos), converged, wall, _concatenated(steps), trace


# Rounds per window of the stochastic EM's stopping test.
_EM_WINDOW = 5


def _bound_settled(bounds: list, tol: float) -> bool:
    """The bound's remaining gain, extrapolated from its last gains per round, is below
    ``tol * (1 + |bound|)``.

    EM converges linearly: with gains ``g_{r-1}, g_r`` the remaining ones sum to about
    ``g_r rho / (1 - rho)``, ``rho = g_r / g_{r-1}`` (Aitken's estimate). Three
    shrinking gains are required, so one small step between two large ones does not
    stop it; gains that do not shrink (``rho >= 1``) never settle it.
    """
    if len(bounds) < 4:
        return False
    gains = np.diff(np.asarray(bounds[-4:], float))
    if not np.all(np.isfinite(gains)) or np.any(gains < 0):
        return False
    if gains[2] > 0 and not gains[2] < gains[1] < gains[0]:
        return False
    rho = gains[2] / gains[1] if gains[1] > 0 else 0.0
    remaining = gains[2] + gains[2] * rho / (1.0 - rho)
    return bool(remaining <= tol * (1.0 + abs(bounds[-1])))


def _no_trend(values: np.ndarray, tol: float) -> bool:
    """No param drifts over these rounds (``(rounds, d)``): the least-squares slope's
    change across them is within two standard errors of zero (or ``tol``).

    A trend test, not a comparison of two windows' means: a steady drift inflates each
    window's scatter and passed that comparison half way to the optimum (a minibatched
    noise scale stopped at 1.86 against its 1.95).
    """
    n = values.shape[0]
    t = np.arange(n) - (n - 1) / 2.0
    slope = t @ (values - values.mean(axis=0)) / (t @ t)
    resid = values - values.mean(axis=0) - np.outer(t, slope)
    se = np.sqrt(np.sum(resid**2, axis=0) / (n - 2) / (t @ t))
    return bool(np.all(np.abs(slope) * n <= np.maximum(tol, 2.0 * se * n)))


def _flat(free: dict, space) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(free[n], float)) for n in space.names])


def _unflat(flat: np.ndarray, space, like: dict) -> dict:
    out, at = {}, 0
    for n in space.names:
        shape = np.shape(like[n])
        size = int(np.prod(shape))
        out[n] = jnp.asarray(flat[at : at + size].reshape(shape), jnp.result_type(like[n]))
        at += size
    return out


def _concatenated(logs):
    """The step logs (NamedTuples of per-node arrays) of successive E-steps as one."""
    first = logs[0]
    return type(first)(
        *(
            {n: np.concatenate([getattr(log, f)[n] for log in logs]) for n in getattr(first, f)}
            for f in first._fields
        )
    )
