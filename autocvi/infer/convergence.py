"""Stopping rules and the health checks that decide whether a fit may say ``converged``.

Two rules, both evaluated inside the compiled loop on a history of the last
``2 * WINDOW`` ELBOs (:func:`converged_now`):

* deterministic schedules (exact and Gauss-Hermite messages, no subsampling):
  the last three relative changes are all below ``tol``. One small change can
  happen at the turning point of an oscillation; three in a row cannot. And the
  ELBO is not still climbing steadily towards a limit more than
  ``REMAINING_LIMIT * tol`` above it (:func:`slow_climb`): small changes can also
  be slow ones.
* stochastic schedules: after a burn-in of ``BURN_IN`` iterations (so that no
  window holds the first, transient ELBOs), the least-squares slope of the
  last ``2 * WINDOW`` ELBOs, times the window length, is below ``tol``
  (relative), or within two standard errors of zero and below ``RISE_LIMIT``
  nats; and the ELBO's scatter around that trend is at most 1 nat or 0.1%.

Any non-finite ELBO in the history blocks convergence. After the loop,
:func:`diagnose` checks the state itself (non-finite parameters, collapsed
variances, a state that never moved) and :class:`Diagnostics` carries what it
found; ``fit`` warns, naming the site, and reports ``converged=False`` for
every problem that makes the answer untrustworthy.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from ..engine.step import collapsed

__all__ = [
    "WINDOW",
    "BURN_IN",
    "converged_now",
    "slow_climb",
    "still_climbing",
    "LONG_WINDOW",
    "Diagnostics",
    "diagnose",
    "diagnose_schedule",
    "FitWarning",
]

# ELBOs per window of the stochastic test; the history holds two windows.
WINDOW = 10
# Iterations before the stochastic test may pass: the history then no longer
# holds the first iterations' transient.
BURN_IN = 3 * WINDOW
# Largest ELBO change over the last 2 * WINDOW iterations (nats, by the fitted
# trend) that the stochastic rule may call converged.
RISE_LIMIT = 0.5


def noise_limit(level):
    """Largest sd of the ELBO around its trend that a converged stochastic fit may show:
    1 nat, or 0.1% of the ELBO when that is larger."""
    return jnp.maximum(1.0, 1e-3 * jnp.abs(level))


class FitWarning(UserWarning):
    """A fit finished, but its result should not be trusted as it stands."""


# How far, in units of ``tol`` times the ELBO, a deterministic fit's extrapolated
# remaining gain may be when it stops (:func:`slow_climb`).
REMAINING_LIMIT = 1.0
# A window's rise must be this many standard errors of its fitted slope, and this many
# ulp of the ELBO, to count as a climb (:func:`slow_climb`).
CLIMB_SE = 1.5
CLIMB_ULPS = 8.0


def slow_climb(history, tol, xp=jnp):
    """Whether the last ``2 * WINDOW`` ELBOs of a deterministic run still climb steadily
    towards a limit more than ``REMAINING_LIMIT * tol`` (relative) above the last one.

    Three small changes in a row do not tell a fit at its optimum from one creeping
    towards it: a log-loss DLM fit whose line search accepted slivers of each step
    (Gaussian block, heavy-tailed noise, N = 400, beta = 0.01) changed by 1e-6
    relative three times and stopped with its sds 7.7% from the optimum's, saying
    converged. So the rule also fits a line to each half of the history: when both
    slopes are clearly positive (``CLIMB_SE`` standard errors, pooled from the scatter
    around the lines, which in float32 is tens of ulp of the ELBO per evaluation), the
    per-iteration rate is ``r = (s_new / s_old)^(1 / WINDOW)`` (a linearly converging
    fixed-point iteration), and what is left after the last ELBO is about
    ``s_new r^(WINDOW / 2) / (1 - r)``, both taken at the slopes' confidence bounds
    (``CLIMB_SE`` standard errors: the newer slope high, the older low). A rise at
    rounding level is never a climb. Early in a run (history not yet full) it does
    not apply.
    """
    n = history.shape[0] // 2
    t = xp.arange(n, dtype=history.dtype) - (n - 1) / 2.0
    tt = xp.sum(t * t)
    halves = xp.stack([history[:n], history[n:]])
    centred = halves - xp.mean(halves, axis=1, keepdims=True)
    slopes = centred @ t / tt
    resid = centred - slopes[:, None] * t[None, :]
    se = xp.sqrt(xp.sum(resid**2) / (2 * (n - 2)) / tt)
    scale = xp.maximum(1.0, xp.abs(history[-1]))
    floor = CLIMB_ULPS * xp.finfo(history.dtype).eps * scale / n
    old, new = slopes[0], slopes[1]
    climbing = (
        (old > CLIMB_SE * se) & (new > CLIMB_SE * se) & (old > floor) & (new > floor)
    ) & xp.all(xp.isfinite(history))
    # The rate's upper confidence bound: a noisy ratio of two slopes must not stop a
    # climb whose rate it underestimates (float32 DLM above: 0.90 estimated, ~0.997 true).
    high, low = new + CLIMB_SE * se, old - CLIMB_SE * se
    rho = xp.where(climbing & (low > 0.0), high / xp.where(low > 0.0, low, 1.0), xp.inf)
    r = xp.minimum(rho, 1.0) ** (1.0 / n)
    left = xp.where(rho < 1.0, high * r ** (n / 2.0) / xp.maximum(1.0 - r, 1e-30), xp.inf)
    return climbing & (left > REMAINING_LIMIT * tol * scale)


# ELBOs the host's check reads (:func:`still_climbing`).
LONG_WINDOW = 100


def still_climbing(elbos, tol) -> bool:
    """:func:`slow_climb` on the last ``LONG_WINDOW`` ELBOs of a deterministic run (an
    even number, at least ``2 * WINDOW``), checked on the host when the compiled rule
    fires. Twenty ELBOs cannot see a climb of 1 ulp per iteration under float32's
    rounding scatter of ~6 ulp per evaluation (the DLM fit above, in float32, stopped
    with its sds 4.6% short); a hundred can."""
    n = min(len(elbos), LONG_WINDOW) // 2 * 2
    if n < 2 * WINDOW:
        return False
    return bool(slow_climb(np.asarray(elbos[-n:], dtype=float), tol, xp=np))


def converged_now(history, iteration, tol, deterministic: bool, subsampled: bool = False):
    """The stopping rule on the last ``2 * WINDOW`` ELBOs (NaN where not yet run).

    Args:
        history: shape ``(2 * WINDOW,)``, oldest first.
        iteration: iterations run so far (including the newest).
        tol: relative tolerance; 0 never stops.
        deterministic: which of the two rules applies (module docstring).
        subsampled: the ELBO is estimated from minibatches, whose noise is
            part of the estimate, so the noise limit does not apply.
    """
    if deterministic:
        last = history[-4:]
        scale = jnp.maximum(1.0, jnp.abs(last[-1]))
        small = jnp.abs(jnp.diff(last)) <= tol * scale
        conv = jnp.all(small) & jnp.all(jnp.isfinite(last)) & ~slow_climb(history, tol)
    else:
        n = history.shape[0]
        t = jnp.arange(n, dtype=history.dtype) - (n - 1) / 2.0
        mean = jnp.mean(history)
        slope = jnp.sum(t * (history - mean)) / jnp.sum(t * t)
        resid = history - mean - slope * t
        se = jnp.sqrt(jnp.sum(resid**2) / (n - 2) / jnp.sum(t * t))
        rise = jnp.abs(slope) * n
        # No detectable trend, and in any case less than RISE_LIMIT nats per
        # window: a slow climb hidden in noise is not convergence.
        within_noise = (rise <= 2.0 * se * n) & (rise <= RISE_LIMIT)
        conv = (rise <= tol * jnp.maximum(1.0, jnp.abs(mean))) | within_noise
        # "Within the noise" only counts when the noise is small: an ELBO that
        # swings by more than NOISE_LIMIT is oscillating, not converged.
        spread = jnp.sqrt(jnp.sum(resid**2) / (n - 2))
        quiet = (spread <= noise_limit(mean)) | subsampled
        conv = conv & quiet & jnp.all(jnp.isfinite(history)) & (iteration >= BURN_IN)
    return conv & (tol > 0)


@dataclass
class Diagnostics:
    """What the health checks found, per site (empty lists mean healthy).

    Attributes:
        non_finite_elbo: iterations (0-based) whose ELBO was NaN or infinite.
        non_finite_terms: when the last ELBOs were not finite, the ELBO's terms that are
            not finite at the final q (a factor's expected log density, named with its
            kind, site and distribution; a block's ELBO; a node's entropy): where the fit
            broke, named in the warning.
        late_non_finite_elbo: those of them among the last ``2 * WINDOW`` iterations; only
            these make the fit untrustworthy. Earlier ones are a start where the model's
            density was not finite (a saturated link at the prior's centre), which the
            line search left on the first finite step: a Beta regression on an uncentred
            covariate had -inf at its first two iterations, then reached NUTS's posterior
            to 0.04 sd, and was called not converged with advice to look for NaN data.
        elbo_decreases: for deterministic schedules, iterations whose ELBO fell
            by more than rounding (a safeguarded deterministic schedule never
            does; each one points at an unsafeguarded message).
        non_finite: sites whose variational parameters are not finite.
        collapsed: sites with a Gaussian q whose variance collapsed to ~0.
        frozen: True when the state never changed from its initial value.
        messages: the warnings issued, one line each.
        step_sizes: per node, the step size of the last iteration (0: refused).
        halvings: per node, line-search halvings summed over the run (only
            nodes with estimated messages search; the others report 0).
        refused: per node, how many iterations the line search refused every
            step size (the node kept its parameters); nodes never refused are absent.
        stuck: nodes whose every step of the last ``WINDOW`` iterations was
            refused: their ELBO stopped changing because nothing moved, which
            the stopping rule cannot tell from convergence.
        unhelpful: nodes with sampled gradients (DLM's bMC, uPS) whose steps the line
            search refused in most of the last ``WINDOW`` iterations.
        non_finite_messages: per node whose incoming message was not finite in any of
            the last ``WINDOW`` iterations, at how many iterations of the run it was: a
            factor's log density or its gradient overflowed where q puts mass, so the node
            could not move (float32's ``exp`` overflows above 88). Untrustworthy.
        hazards: the planner's warnings about approximations that can leave the
            fit far from the optimum (``Schedule.hazards``).
        importance: how well q covers the posterior: the Pareto-k and effective
            sample size of q's importance ratios
            (:class:`autocvi.infer.importance.ImportanceCheck`; ``fit`` warns when
            both say q misses posterior mass); None where it was not computed. It
            judges q as an approximation, not the optimisation, so it does not
            change ``trustworthy`` or ``converged``.
        couplings: latents whose sds mean-field between q's factors shrinks well below
            the posterior's (:class:`autocvi.infer.coupling.Coupling`; ``fit`` warns).
        refit: what ``fit``'s refit of such latents in a joint Gaussian found, or None
            where it was not tried (:func:`autocvi.fit`).
    """

    non_finite_elbo: list = field(default_factory=list)
    late_non_finite_elbo: list = field(default_factory=list)
    # the ELBO's terms (factors, with what they are) not finite at the final q, when
    # the ELBO was not finite at the end
    non_finite_terms: list = field(default_factory=list)
    elbo_decreases: list = field(default_factory=list)
    non_finite: list = field(default_factory=list)
    collapsed: list = field(default_factory=list)
    frozen: bool = False
    noisy: float | None = None
    messages: list = field(default_factory=list)
    step_sizes: dict = field(default_factory=dict)
    halvings: dict = field(default_factory=dict)
    refused: dict = field(default_factory=dict)
    stuck: list = field(default_factory=list)
    unhelpful: list = field(default_factory=list)
    non_finite_messages: dict = field(default_factory=dict)
    hazards: list = field(default_factory=list)
    # an ImportanceCheck (typed loosely: autocvi.infer.importance imports this module)
    importance: object = None
    # autocvi.infer.coupling.Coupling per latent mean-field shrinks (fit's check)
    couplings: list = field(default_factory=list)
    # what fit's refit of coupled latents in a joint Gaussian found (None: not tried)
    refit: str | None = None

    @property
    def trustworthy(self) -> bool:
        return not (
            self.late_non_finite_elbo
            or self.non_finite
            or self.collapsed
            or self.frozen
            or self.stuck
            or self.unhelpful
            or self.non_finite_messages
            or self.hazards
            or self.noisy is not None
            or len(self.elbo_decreases) > 0
        )


def diagnose(
    elbo,
    initial_natural,
    natural,
    layouts,
    blocks,
    deterministic: bool,
    subsampled: bool = False,
    steps=None,
    hazards=(),
    sampled=(),
) -> Diagnostics:
    """Check a finished run; see :class:`Diagnostics` for what is checked.

    ``steps``: the loop's per-node record (``autocvi.infer.fit.StepLog``), if any;
    ``hazards``: the schedule's (reported as they are, and untrustworthy);
    ``sampled``: nodes whose messages' gradients are sampling estimates (DLM's bMC, uPS).
    """
    d = Diagnostics(hazards=list(hazards))
    for name, bad in (getattr(steps, "non_finite", None) or {}).items():
        if np.any(bad[-WINDOW:]):
            d.non_finite_messages[name] = int(np.sum(bad))
    if steps is not None:
        for name, sizes in steps.step_sizes.items():
            if sizes.size:
                d.step_sizes[name] = float(sizes[-1])
                d.halvings[name] = int(np.sum(steps.halvings[name]))
                if np.any(sizes == 0):
                    d.refused[name] = int(np.sum(sizes == 0))
                if np.all(sizes[-WINDOW:] == 0) and name not in d.non_finite_messages:
                    d.stuck.append(name)
                elif name in sampled and np.mean(sizes[-WINDOW:] == 0) >= 0.5:
                    d.unhelpful.append(name)
    elbo = np.asarray(elbo, dtype=float)
    d.non_finite_elbo = [int(i) for i in np.flatnonzero(~np.isfinite(elbo))]
    d.late_non_finite_elbo = [i for i in d.non_finite_elbo if i >= elbo.size - 2 * WINDOW]
    if deterministic and elbo.size > 1:
        finite = np.isfinite(elbo[:-1]) & np.isfinite(elbo[1:])
        slack = 1e-5 * (1.0 + np.abs(elbo[1:]))
        drops = finite & (elbo[1:] < elbo[:-1] - slack)
        d.elbo_decreases = [int(i) + 1 for i in np.flatnonzero(drops)]
    for name, lam in natural.items():
        leaves = jax.tree_util.tree_leaves(lam)
        if not all(bool(np.all(np.isfinite(np.asarray(x)))) for x in leaves):
            d.non_finite.append(name)
            continue
        if name in blocks:
            continue
        lay = layouts[name]
        if lay.q_family in ("Normal", "MultivariateNormal"):
            if collapsed(tuple(np.asarray(x) for x in lam), lay.q_family, xp=np):
                d.collapsed.append(name)
    moved = initial_natural is None
    for name in natural if initial_natural is not None else ():
        for a, b in zip(
            jax.tree_util.tree_leaves(initial_natural[name]),
            jax.tree_util.tree_leaves(natural[name]),
        ):
            # allclose: averaging the iterates of a node that never moved rounds its bits
            if not np.allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=0.0):
                moved = True
    d.frozen = bool(natural) and not moved
    tail = elbo[-2 * WINDOW :]
    if not deterministic and not subsampled and elbo.size >= BURN_IN and np.all(np.isfinite(tail)):
        t = np.arange(tail.size) - (tail.size - 1) / 2.0
        resid = tail - tail.mean() - t * np.sum(t * (tail - tail.mean())) / np.sum(t * t)
        spread = float(np.sqrt(np.sum(resid**2) / (tail.size - 2)))
        if spread > float(noise_limit(tail.mean())):
            d.noisy = spread
    return d


def diagnose_schedule(schedule, elbo, initial_natural, natural, deterministic, subsampled, steps):
    """:func:`diagnose` for a run of ``schedule`` (its layouts, blocks and hazards)."""
    layouts = {n: node.layout for n, node in schedule.nodes.items()}
    return diagnose(
        elbo,
        initial_natural,
        natural,
        layouts,
        schedule.blocks,
        deterministic,
        subsampled,
        steps,
        schedule.hazards,
        tuple(schedule.nodes) if schedule.objective.sampled_gradients else (),
    )


def report(d: Diagnostics, num_steps: int) -> None:
    """Fill ``d.messages`` and issue one :class:`FitWarning` per problem."""
    if d.late_non_finite_elbo:
        first = d.non_finite_elbo[0]
        head = (
            f"the ELBO was not finite at {len(d.non_finite_elbo)} of {num_steps} iterations "
            f"(first at iteration {first}); the result is not a converged fit."
        )
        if d.non_finite_terms:
            d.messages.append(
                f"{head} At the final q these of its terms are not finite: "
                f"{'; '.join(d.non_finite_terms)}. Either that site's data hold NaN (use "
                "obs_mask for missing values), or q puts mass where its density (or the map "
                "to its support) overflows or underflows: in float32, a simplex weight or a "
                "positive latent rounded to 0 where the density is unbounded (a Dirichlet or "
                "Beta concentration below 1, a Gamma shape below 1), or exp of a large "
                "predictor. Enable float64 (jax.config.update('jax_enable_x64', True)), or "
                "give that site a prior whose density is bounded there."
            )
        else:
            d.messages.append(
                f"{head} Check the observations for NaN (use obs_mask for missing values) "
                "and the priors' supports."
            )
    if d.elbo_decreases:
        d.messages.append(
            f"the ELBO decreased at {len(d.elbo_decreases)} iterations of a deterministic "
            f"schedule (first at {d.elbo_decreases[0]}): the updates oscillate; try a smaller "
            "step_size."
        )
    for name in d.non_finite:
        d.messages.append(
            f"site {name!r}: its variational parameters are not finite; the fit failed there."
        )
    for name in d.collapsed:
        d.messages.append(
            f"site {name!r}: the variance of its Gaussian q collapsed to ~0 (a degenerate fixed "
            "point, usually from an unstable update); do not trust its posterior."
        )
    if d.noisy is not None:
        d.messages.append(
            f"the ELBO still swings by {d.noisy:.3g} nats (sd around its trend) over the last "
            f"{2 * WINDOW} iterations: the updates oscillate or their Monte Carlo estimates are "
            "too noisy; try a smaller step_size or a larger num_samples."
        )
    for name in d.stuck:
        d.messages.append(
            f"node {name!r}: the line search refused every step of the last {WINDOW} "
            "iterations (no step size improved the ELBO's estimate, or it was not finite), so "
            "its ELBO stopped changing without converging. Start elsewhere: "
            "init_strategy=numpyro.infer.init_to_value(values={...}) near where the data put "
            "the latents, or no init_strategy (autocvi then tries three starts), or pass a "
            "larger num_samples."
        )
    for name, count in d.non_finite_messages.items():
        cause = (
            "the terms the ELBO's warning names"
            if d.non_finite_terms
            else "in float32, exp of a linear predictor above ~88: a large coefficient on a "
            "covariate with large values"
        )
        d.messages.append(
            f"node {name!r}: its incoming message (the expected gradient of its factors' log "
            f"densities under q) was not finite at {count} of {num_steps} iterations, "
            "including the last ones, so the node could not move there: a factor's log "
            f"density or its gradient overflows where q puts mass ({cause}). The result is "
            "wherever q was left, not a fit. Enable float64 "
            "(jax.config.update('jax_enable_x64', True)), scale the covariates, pass a "
            "smaller step_size, or start nearer the data (init_strategy)."
        )
    for name in d.unhelpful:
        d.messages.append(
            f"node {name!r}: the line search refused most of its sampled-gradient steps in the "
            f"last {WINDOW} iterations: the estimates (bMC, uPS) are not ascent directions of "
            "the objective here, so q stopped short of its optimum. Pass a larger num_samples, "
            "or gradient='quadrature' (exact for these one-dimensional predictors)."
        )
    for hazard in d.hazards:
        d.messages.append(f"the result may be far from the optimum: {hazard}")
    if d.frozen:
        d.messages.append(
            "the variational parameters never changed from their initial values: every update "
            "was refused or had no effect, so this is the starting point, not a fit."
        )
    for m in d.messages:
        warnings.warn(m, FitWarning, stacklevel=3)
