"""After a fit: does q cover the posterior? Importance ratios and their Pareto tail.

Draw ``S`` values ``theta_s`` from q and form the importance ratios
``r_s = p(y, theta_s) / q(theta_s)``. Where q is close to the posterior they are nearly
constant; where q misses posterior mass (too narrow, the wrong shape: a funnel, a skewed
scale, a second mode) a few draws carry enormous ratios. Two numbers summarise them:

* ``pareto_k``: the shape of a generalised Pareto distribution fitted to the ratios'
  right tail. The ratios' variance is infinite beyond 0.5, and beyond 0.7 importance
  sampling with q is unreliable (Yao, Vehtari, Simpson and Gelman, "Yes, but did it
  work?: Evaluating variational inference", ICML 2018, Sec. 3; Vehtari, Simpson, Gelman,
  Yao and Gabry, "Pareto smoothed importance sampling", JMLR 2024, Sec. 3). Estimated
  by Zhang and Stephens' empirical-Bayes fit ("A new and efficient estimation method for
  the generalized Pareto distribution", Technometrics 2009, Sec. 2) on the
  ``M = min(S / 5, 3 sqrt(S))`` largest ratios, with the PSIS paper's weak prior on k.
* ``ess``: the ratios' effective sample size over ``S``, ``(sum r)^2 / (S sum r^2)``:
  1 when q is the posterior, small when a few draws carry the weight.

k alone is scale-free: it reads 0.7 or more on ratios that are all within a factor of
two of each other (a large-N GLM whose posterior's tails are barely heavier than
Gaussian: ess 0.999), and on good fits of models with a hundred coordinates, where
small per-coordinate differences add up (ess 0.1-0.2; measured on the model zoo against
NUTS, ``docs/limitations.md``). ``fit`` therefore warns only when both say q misses
posterior mass: ``pareto_k > 0.7`` and ``ess < 0.05``. The numbers are on
``result.diagnostics`` either way.

A q can also cover the posterior's bulk and still be too narrow at one latent: the full
Gaussian over a centred Poisson hierarchy's scale and its 301 effects has k 0.67 and ESS
12%, yet its sd of the scale is 0.74 of NUTS's, because the posterior is not Gaussian
in that coordinate. The same draws measure it: per coordinate of the latents (on their
constrained values), q's sd against the importance-weighted sd, with truncated
importance weights (Ionides, "Truncated importance sampling", JCGS 2008: each weight
capped at ``sqrt(S)`` times their mean) and the delta-method standard error of the
log-variance difference. ``fit`` warns when the weighted sd is wider by more than
:data:`SPREAD_LIMIT` at :func:`spread_z_limit` standard errors or more (3 with a few
coordinates, up to :data:`SPREAD_Z` with hundreds: a Bonferroni bound; ``narrowest`` names the
coordinate).

The same per-coordinate spread also reads the other way (:attr:`ImportanceCheck.too_wide`,
above :data:`WIDE_LIMIT`): a Gaussian q in the unconstrained coordinate of a latent whose
posterior piles against its support's edge (a truncated prior's bound) is 1.2-1.3x the
exact sd, and weighting is reliable in that direction.

Weighting cannot recover mass q never draws: with q's own draws the ratio understates a
miss (0.86 where NUTS says 0.63, on the ordered means of a Gaussian mixture). The spread
therefore also draws from a defensive proposal (Hesterberg, "Weighted average importance
sampling and defensive mixture distributions", Technometrics 1995): as many draws again
from q_s, q with its Gaussian sds doubled (:data:`DEFENSIVE_SCALE`; conjugate families
unwidened), every draw weighted by ``p / g`` with ``g`` the mixture of q and q_s in the
proportions drawn (Veach and Guibas' balance heuristic, "Optimally combining sampling
techniques for Monte Carlo rendering", SIGGRAPH 1995). q's tails are then sampled, and
the mixture's ratio reads 0.68 where NUTS says 0.63, while a q that matches NUTS still
reads about 1. The Pareto-k and ESS are those of q's own draws, as the papers define
them. The defensive draws are skipped where the data are large (:data:`DEFENSIVE_WORK`).

A spread that reads past its limit without enough draws to say so (at least
:data:`SECOND_LOOK_Z` but fewer than the z limit's standard errors) is read again on up to
five times as many draws, the first look's among them: a sequential test with two looks
(Armitage, McPherson and Rowe, "Repeated significance tests on accumulating data", JRSS A
1969), each at the Bonferroni z, so the false-alarm rate at most doubles, and only where
the first look already leant that way. It costs a fit only there: the same compiled
program, run with other keys.

A model with one plated discrete latent z (a mixture's assignments, a Categorical per
data point) is checked with z summed out of p (:func:`summed_log_joint`: per element of
z, a logsumexp over its support of the densities that read it) and left out of q: the
ratios are those of q's other latents against their marginal posterior, the one NUTS
samples on the model written with z summed out. With z drawn from q instead, the
ratios of its N mean-field elements measured their number, not q's quality, and the
check made no claim, so a mixture with overlapping components whose parameters' q was
half NUTS's sd went unflagged.

Skipped (no claim) for models with more than one plated discrete latent, or one whose
densities read several of its elements together (a Markov chain of states; a single
discrete latent, a switchpoint, is drawn and checked like the rest), subsampled
plates with local latents (q holds all N, a batch's p only B; a minibatched model whose
latents are all global is checked with p on the whole data), integrated conditionals, q with more than :data:`MAX_COORDINATES` coordinates, and data so large that even
:data:`MIN_DRAWS` draws would cost more than :data:`MAX_WORK` element evaluations of the
log joint (below that, the draws shrink from :data:`NUM_DRAWS` to fit it).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from statistics import NormalDist

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer.util import compute_log_probs, log_density

from ..jaxpr import structural_jit
from ..model.trace import MaskedPlaceholder, full_plates
from .convergence import FitWarning

__all__ = [
    "ImportanceCheck",
    "Spread",
    "importance_draws",
    "pareto_k",
    "effective_sample_fraction",
    "log_importance_ratios",
    "check_importance",
    "K_LIMIT",
    "ESS_LIMIT",
    "NUM_DRAWS",
    "SPREAD_LIMIT",
    "WIDE_LIMIT",
    "spreads_of",
    "SPREAD_Z",
    "spread_of",
    "spread_z_limit",
    "widened",
    "DEFENSIVE_SCALE",
]

# fit warns when both hold (module docstring): the Pareto tail is heavy (Yao et al. 2018,
# Sec. 3; PSIS paper, Sec. 3) and fewer than 5% of the draws carry the weight; or when
# fewer than 2% carry it and the tail is at least moderately heavy (k > 0.5: a centred
# hierarchy's scale with k 0.68 and ESS 1.4%, sd 0.62 of NUTS's, went unflagged). Every
# zoo model whose q matches NUTS has ESS above 8%.
K_LIMIT = 0.7
ESS_LIMIT = 0.05
K_MODERATE = 0.5
ESS_FLOOR = 0.02
NUM_DRAWS = 4000
MIN_DRAWS = 1000
MAX_WORK = 400_000_000  # draws times data elements
MAX_COORDINATES = 5000
# fit warns when q's sd at some coordinate is below SPREAD_LIMIT of the importance-
# weighted sd, at SPREAD_Z standard errors or more (module docstring). With the defensive
# draws, zoo fits whose sds are all within 0.90 of NUTS's read 0.88 or more over five
# draw keys where significant (0.93 or more with fit's own key); the narrow ones read
# 0.23-0.84 (a Gamma hierarchy's alpha, sd 0.81 of NUTS's: 0.81-0.86, which the
# earlier limit of 0.85, set for q's own draws, let pass with fit's key).
SPREAD_LIMIT = 0.87
# fit warns when q's sd at some coordinate is above WIDE_LIMIT times the importance-
# weighted sd, at the same z (the other direction): see ImportanceCheck.too_wide.
WIDE_LIMIT = 1.2
SPREAD_Z = 4.0
# The z limit depends on how many coordinates the narrowest is chosen from: Bonferroni at
# a family-wise false-alarm rate of SPREAD_ALPHA, z >= Phi^-1(1 - SPREAD_ALPHA / d),
# clipped to [SPREAD_Z_MIN, SPREAD_Z] (d <= 7: 3.0; d = 100: 3.7; d >= ~320: 4.0, the
# zoo's calibration above). With two to a dozen coordinates a fixed 4 missed q's
# narrower than any Gaussian can avoid (new-user models against exact grids and NUTS: a
# truncated-normal likelihood's mu, ratio 0.79 at z 3.56, sd 0.45 of the exact one; a
# negative binomial's dispersion, 0.82 at z 3.3; a non-centred scale, 0.75 at z 3.6).
SPREAD_ALPHA = 0.01
# The spread check's defensive draws come from q with its Gaussian sds doubled (module
# docstring).
DEFENSIVE_SCALE = 2.0
# ... where q's draws times the data elements are at most this: with more data the
# posterior is close to Gaussian (a Poisson GLM on 10,095 rows reads 1.00 from q's own
# draws) and the extra draws would cost more than the fit (0.35 s against its 0.5 s).
DEFENSIVE_WORK = 40_000_000
SPREAD_Z_MIN = 3.0
# The spread's second look (module docstring): where a coordinate reads past its limit at
# SECOND_LOOK_Z or more standard errors but below the z limit, up to SECOND_LOOK_DRAWS
# times as many draws again, within SECOND_LOOK_ELEMENTS kept values (draws times
# coordinates) and SECOND_LOOK_WORK element evaluations of the log joint. A Dirichlet(0.5)
# mixture's empty weight, q's sd 1.32x NUTS's, read 1.23 at 2.3 standard errors on the
# first look (below the limit of 3) and was not flagged.
SECOND_LOOK_Z = 1.0
SECOND_LOOK_DRAWS = 4
SECOND_LOOK_ELEMENTS = 40_000_000
SECOND_LOOK_WORK = 160_000_000
# The spread check keeps q's draws of every coordinate: up to this many coordinates.
SPREAD_MAX_COORDINATES = 1000
_BATCH = 250
_BATCH_WORK = 10_000_000  # draws times data elements held at once
# Zhang and Stephens' grid size is m = 30 + sqrt(n); the prior on b scales with the
# first quartile (their Sec. 2); the PSIS paper's prior on k: n_0 = 10 at k_0 = 0.5.
_PRIOR_B = 3.0
_PRIOR_K_WEIGHT = 10.0
_PRIOR_K = 0.5


def pareto_k(log_ratios) -> float:
    """The estimated generalised-Pareto shape of the ratios' right tail (module docstring).

    ``log_ratios``: ``log p(y, theta_s) - log q(theta_s)`` for draws ``theta_s ~ q``
    (any constant offset cancels). NaN when fewer than 25 ratios are finite; ``inf``
    when some ratio is ``+inf``.
    """
    lr = np.asarray(log_ratios, np.float64).ravel()
    if np.any(lr == np.inf):
        return float("inf")
    lr = lr[np.isfinite(lr)]
    s = lr.size
    if s < 25:
        return float("nan")
    tail = int(np.ceil(min(0.2 * s, 3.0 * np.sqrt(s))))
    lr = np.sort(lr)
    # Exceedances over the threshold (the largest ratio below the tail), scaled so
    # that the largest ratio is 1: the shape does not depend on the scale.
    ratios = np.exp(lr - lr[-1])
    x = ratios[-tail:] - ratios[-tail - 1]
    x = np.maximum(x, 0.0)
    if x[int(tail / 4 + 0.5) - 1] <= 0:
        # A quarter of the tail ties with the threshold: the ratios are constant up to
        # rounding (q is the posterior), which has no Pareto tail.
        return 0.0
    return _zhang_stephens_shape(x)


def _zhang_stephens_shape(x) -> float:
    """Zhang and Stephens (2009) posterior-mean estimate of the GPD shape of ``x`` (sorted,
    non-negative exceedances), with the PSIS paper's prior on the shape.

    The GPD is parameterised by ``theta = -k / sigma``; the profile likelihood of
    ``theta`` is ``n (log(-theta / k(theta)) - k(theta) - 1)`` with ``k(theta) =
    mean(log(1 - theta x))`` (their Eq. 5-6); theta's posterior mean over a grid of
    quantile-spaced values gives ``k = mean(log(1 - theta_hat x))``.
    """
    n = x.size
    grid = 30 + int(np.sqrt(n))
    quartile = x[int(n / 4 + 0.5) - 1]
    theta = 1.0 / x[-1] + (1.0 - np.sqrt(grid / (np.arange(1, grid + 1) - 0.5))) / (
        _PRIOR_B * quartile
    )
    k_of = np.mean(np.log1p(-theta[:, None] * x[None, :]), axis=1)
    log_lik = n * (np.log(-theta / k_of) - k_of - 1.0)
    weights = np.exp(log_lik - np.logaddexp.reduce(log_lik))
    theta_hat = float(np.sum(theta * weights))
    k = float(np.mean(np.log1p(-theta_hat * x)))
    return (n * k + _PRIOR_K_WEIGHT * _PRIOR_K) / (n + _PRIOR_K_WEIGHT)


def log_importance_ratios(
    model, data: dict, params: dict, guide_of, natural, rng_key, num_draws: int
):
    """``log p(y, theta_s) - log q(theta_s)`` for ``num_draws`` draws from q (as
    :func:`importance_draws`, without the draws)."""
    return importance_draws(
        model, data, params, guide_of, natural, rng_key, num_draws, keep_draws=False
    )[0]


def importance_draws(
    model,
    data: dict,
    params: dict,
    guide_of,
    natural,
    rng_key,
    num_draws: int,
    keep_draws: bool = True,
    defensive: int = 0,
):
    """:func:`importance_sampler`'s draws with ``rng_key``."""
    sampler = importance_sampler(model, data, params, guide_of, num_draws, keep_draws, defensive)
    return sampler(natural, rng_key)


def importance_sampler(
    model,
    data: dict,
    params: dict,
    guide_of,
    num_draws: int,
    keep_draws: bool = True,
    defensive: int = 0,
    summed: SummedSite | None = None,
):
    """``(natural, rng_key) -> (log_ratios, draws, log_weights)``, one compiled program
    for any number of calls: ``log p(y, theta_s) - log q(theta_s)`` for
    ``num_draws`` draws ``theta_s`` from q; then ``defensive`` more draws from q_s, q
    widened by :data:`DEFENSIVE_SCALE` (:func:`widened`); all the draws (latent site ->
    ``(num_draws + defensive, *shape)`` constrained values, q's first; ``{}`` unless
    ``keep_draws``); and every draw's ``log p - log g`` with g the mixture of q and q_s
    in the proportions drawn (Veach and Guibas' balance heuristic; with ``defensive=0``,
    g = q).

    ``guide_of(natural)``: q as a :class:`~autocvi.infer.guide.CVIGuide` at the engine's
    natural parameters ``natural`` (joint groups drawn together, their density on the
    members' values by the group's change of variables), built inside the compiled
    program: built eagerly, every small op of q's construction compiles on its own
    (seconds of a cold fit). ``params``: the model's ``numpyro.param`` values. One
    compiled program, vectorised over the draws. ``summed``: a plated discrete latent
    summed out of p and left out of q (:func:`summed_log_joint`): the ratios are then q's
    of the other latents against their marginal posterior.
    """
    fixed = handlers.substitute(model, data=dict(params)) if params else model
    # The defensive draws' proposal g = (S q + D q_s) / (S + D) (module docstring).
    log_share_q = float(np.log(num_draws / (num_draws + defensive)))
    log_share_s = float(np.log(defensive / (num_draws + defensive))) if defensive else -np.inf

    def one(key, arrays, natural, from_q_s):
        guide = guide_of(natural)
        keys = jax.random.split(key, len(guide.joint) + len(guide.posterior))
        values, log_q, log_qs = {}, 0.0, 0.0
        for k, (group, q_z) in zip(keys, guide.joint):
            z, lq, lqs = _draw(q_z, k, from_q_s)
            values.update(group.values(z))
            jac = group.log_abs_det_jacobian(z)
            log_q, log_qs = log_q + lq - jac, log_qs + lqs - jac
        single = {}
        for k, (name, q) in zip(keys[len(guide.joint) :], guide.posterior.items()):
            if name not in values and (summed is None or name != summed.name):
                values[name], lq, lqs = _draw(q, k, from_q_s, reduce=False)
                single[name] = (lq, lqs)
        if summed is None:
            log_p, model_trace = log_density(fixed, (), {**data, **arrays}, values)
        else:
            log_p, model_trace = summed_log_joint(fixed, {**data, **arrays}, values, summed)
        for name, (lq, lqs) in single.items():
            # Elements the model masks out (``obs_mask``'s unobserved part covers every
            # element) are not in p: they are left out of q's density too.
            mask = _site_mask(model_trace[name])
            if mask is not None:
                lq = jnp.where(jnp.broadcast_to(mask, jnp.shape(lq)), lq, 0.0)
                lqs = jnp.where(jnp.broadcast_to(mask, jnp.shape(lqs)), lqs, 0.0)
            log_q, log_qs = log_q + jnp.sum(lq), log_qs + jnp.sum(lqs)
        for group, _ in guide.joint:
            # q's joint density covers every element of a masked member; p gets the
            # elements the model masks out with the density the engine's target gives
            # them (MaskedPlaceholder's N(0, 1)), so p/q is the ratio fit optimised.
            for m in group.members:
                site = model_trace[m.name]
                mask = _site_mask(site)
                if mask is not None:
                    filled = MaskedPlaceholder(site["fn"], mask).log_prob(values[m.name])
                    log_p = log_p + jnp.sum(jnp.where(mask, 0.0, filled))
        log_g = jnp.logaddexp(log_q + log_share_q, log_qs + log_share_s)
        return log_p - log_q, log_p - log_g, (values if keep_draws else {})

    # The data arrays enter as arguments, not as constants folded into the program.
    arrays = {k: v for k, v in data.items() if isinstance(v, (np.ndarray, jax.Array))}
    # Vectorised over batches of draws, the batches in sequence: memory stays at a
    # batch's draws times the data, not all the draws'.
    size = sum(int(np.size(v)) for v in arrays.values())
    batch = int(np.clip(_BATCH_WORK // max(size, 1), 1, _BATCH))
    # q's draws in whole batches, then q_s's: q's keys (and so its draws and the Pareto
    # and ESS numbers) do not depend on ``defensive``.
    q_size = -(-num_draws // batch) * batch
    batches = q_size // batch + -(-defensive // batch)
    from_q_s = (np.arange(batches * batch) >= q_size).reshape(batches, batch)
    kept = np.r_[np.arange(num_draws), q_size + np.arange(defensive)]

    # Runs once per fit: compiled for a short compilation (most of the check's cost). The
    # keys are split inside: split eagerly, they compiled a program of their own (0.17 s
    # of a cold fit).
    @structural_jit(runs_once=True)
    def ratios(rng_key, arrays, natural, from_q_s):
        keys = jax.random.split(rng_key, q_size)
        if defensive:
            more = jax.random.split(jax.random.fold_in(rng_key, 1), batches * batch - q_size)
            keys = jnp.concatenate([keys, more])
        keys = keys.reshape((batches, batch) + keys.shape[1:])
        draws = jax.vmap(one, in_axes=(0, None, None, 0))
        return jax.lax.map(lambda kw: draws(kw[0], arrays, natural, kw[1]), (keys, from_q_s))

    def sample(natural, rng_key):
        # Validation is off while q is built from traced values (nothing to check eagerly).
        with numpyro.validation_enabled(False):
            out, out_g, draws = ratios(rng_key, arrays, natural, from_q_s)
        draws = {k: np.asarray(v).reshape((-1,) + np.shape(v)[2:])[kept] for k, v in draws.items()}
        return np.asarray(out).ravel()[:num_draws], draws, np.asarray(out_g).ravel()[kept]

    return sample


def widened(q, scale: float):
    """q with its Gaussian spread multiplied by ``scale`` (same mean; the same transforms
    to the site's support), or None where q is not a Gaussian (or a transformed one):
    conjugate families are drawn unwidened."""
    if isinstance(q, dist.MultivariateNormal):
        return dist.MultivariateNormal(q.loc, scale_tril=scale * q.scale_tril)
    if isinstance(q, dist.Normal):
        return dist.Normal(q.loc, scale * q.scale)
    if isinstance(q, dist.Independent):
        inner = widened(q.base_dist, scale)
        return None if inner is None else inner.to_event(q.reinterpreted_batch_ndims)
    if isinstance(q, dist.TransformedDistribution):
        inner = widened(q.base_dist, scale)
        return None if inner is None else dist.TransformedDistribution(inner, q.transforms)
    return None


def _draw(q, key, from_widened, reduce: bool = True):
    """``(value, log q(value), log q_s(value))``: a draw from q, or from q_s (q
    :func:`widened` by :data:`DEFENSIVE_SCALE`) where ``from_widened``; q_s is q where q
    cannot be widened. The densities summed over the value unless not ``reduce``."""
    q_s = widened(q, DEFENSIVE_SCALE)
    if q_s is None:
        value = q.sample(key)
        log_q = log_qs = q.log_prob(value)
    else:
        # One key for both: the same standard-normal draw, scaled or not.
        value = jnp.where(from_widened, q_s.sample(key), q.sample(key))
        log_q, log_qs = q.log_prob(value), q_s.log_prob(value)
    return (value, jnp.sum(log_q), jnp.sum(log_qs)) if reduce else (value, log_q, log_qs)


def _site_mask(site):
    """The elementwise mask of a sample site's distribution (``obs_mask``,
    ``handlers.mask``), or None."""
    fn = site["fn"]
    while isinstance(fn, dist.Independent):
        fn = fn.base_dist
    mask = getattr(fn, "_mask", None) if isinstance(fn, dist.MaskedDistribution) else None
    return None if mask is None or mask is True else mask


@dataclass(frozen=True)
class SummedSite:
    """A plated discrete latent the check sums out of the model: its ``name``, the
    ``shape`` of its value, and ``dependents``, the sites whose densities read it (its
    own among them)."""

    name: str
    shape: tuple
    dependents: frozenset


def summed_site(graph) -> SummedSite | None:
    """The model's one plated discrete latent, to be summed out (module docstring), or
    None: no plated discrete latent, or more than one (their sums would not factorise)."""
    plated = [
        n
        for n, v in graph.variables.items()
        if v.discrete and not v.observed and (v.plates or v.batch_shape)
    ]
    if len(plated) != 1:
        return None
    name = plated[0]
    dependents = {f.site for f in graph.factors.values() if name in f.latents} | {name}
    return SummedSite(name, tuple(graph.variables[name].shape), frozenset(dependents))


def summed_log_joint(model, kwargs: dict, values: dict, summed: SummedSite):
    """``log sum_z p(y, values, z)`` and a model trace, for ``summed``'s latent z whose
    elements are independent given ``values``: each element's sum over its support (the
    distribution's ``enumerate_support``) of the densities that read it, a logsumexp per
    element, plus every other density. A dependent density whose shape does not follow
    z's elements (a sum over several of them) raises: no claim."""
    first = {**values, summed.name: jnp.zeros(summed.shape, jnp.int32)}
    log_probs, model_trace = compute_log_probs(model, (), kwargs, first, sum_log_prob=False)
    rest = sum((jnp.sum(lp) for n, lp in log_probs.items() if n not in summed.dependents), 0.0)
    support = model_trace[summed.name]["fn"].enumerate_support(expand=False)
    per_value = []
    for v in support:
        at = {**values, summed.name: jnp.broadcast_to(v, summed.shape)}
        lps, _ = compute_log_probs(model, (), kwargs, at, sum_log_prob=False)
        per_value.append(sum(_per_element(lps[n], summed.shape) for n in summed.dependents))
    return rest + jnp.sum(jax.nn.logsumexp(jnp.stack(per_value), axis=0)), model_trace


def _per_element(log_prob, shape):
    """``log_prob`` summed to ``shape`` (one value per element of the summed latent): its
    dims left of the latent's and those where the latent has size 1 are summed."""
    lp = jnp.asarray(log_prob)
    extra = lp.ndim - len(shape)
    if extra < 0:
        raise ValueError("a density reads several elements of the summed latent")
    lp = jnp.sum(lp, axis=tuple(range(extra))) if extra else lp
    ones = tuple(i for i, (a, b) in enumerate(zip(lp.shape, shape)) if b == 1 and a != 1)
    lp = jnp.sum(lp, axis=ones, keepdims=True) if ones else lp
    if lp.shape != tuple(shape):
        raise ValueError("a density reads several elements of the summed latent")
    return lp


def spread_z_limit(num_coordinates: int) -> float:
    """The standard errors at which a narrow coordinate counts, among ``num_coordinates``
    (``SPREAD_ALPHA``'s Bonferroni bound, clipped to ``[SPREAD_Z_MIN, SPREAD_Z]``)."""
    z = NormalDist().inv_cdf(1.0 - SPREAD_ALPHA / max(int(num_coordinates), 1))
    return float(min(max(z, SPREAD_Z_MIN), SPREAD_Z))


@dataclass(frozen=True)
class Spread:
    """Where q is narrowest against its importance-weighted draws: the coordinate
    (``"sigma"``, ``"u[3]"``), ``ratio`` = q's sd over the weighted sd there, ``z``,
    the log-variance difference in standard errors, and ``z_limit``, the z that counts
    among this many coordinates (:func:`spread_z_limit`)."""

    coordinate: str
    ratio: float
    z: float
    z_limit: float = SPREAD_Z


@dataclass(frozen=True)
class ImportanceCheck:
    """q's importance ratios summarised (module docstring): ``pareto_k``, ``ess`` (the
    effective sample size over the number of draws), ``num_draws``, ``narrowest``,
    the :class:`Spread` of the coordinate where q is narrowest against the weighted draws
    (None where the spread was not measured: more than ``SPREAD_MAX_COORDINATES``), and
    ``num_defensive``, the spread's draws from q widened (0: large data)."""

    pareto_k: float
    ess: float
    num_draws: int
    narrowest: Spread | None = None
    num_defensive: int = 0
    # the latents with a discrete q (a Categorical switchpoint): their narrowness is
    # mean-field's, not a Gaussian's shape (warn_importance says which)
    discrete_sites: tuple = ()
    # where q is widest against the weighted draws (its z negative)
    widest: Spread | None = None
    # how many batches of num_draws (+ num_defensive) draws the spread read: 1, or more
    # after a second look (module docstring)
    spread_looks: int = 1
    # a plated discrete latent the check summed out of p (q's other latents were checked
    # against their marginal posterior), or None
    summed_site: str | None = None

    def spread_draws(self) -> str:
        """The draws the spread read, in words (the warnings')."""
        n, d = self.num_draws * self.spread_looks, self.num_defensive * self.spread_looks
        return f"{n} draws from q" + (f" and {d} from q widened" if d else "")

    @property
    def too_narrow(self) -> bool:
        """q's sd at some coordinate is below ``SPREAD_LIMIT`` of the importance-weighted
        sd, significantly (``narrowest.z_limit`` standard errors)."""
        n = self.narrowest
        return bool(n is not None and n.ratio < SPREAD_LIMIT and n.z >= n.z_limit)

    @property
    def too_wide(self) -> bool:
        """q's sd at some coordinate is above ``WIDE_LIMIT`` times the importance-weighted
        sd, significantly (``widest.z_limit`` standard errors). Weighting is reliable in
        this direction (q covers the posterior): a Gaussian q of a latent whose posterior
        piles against its support's edge."""
        w = self.widest
        return bool(w is not None and w.ratio > WIDE_LIMIT and -w.z >= w.z_limit)

    @property
    def misses_posterior(self) -> bool:
        """The tail and the weights say q misses posterior mass: a heavy tail with few
        effective draws, or a moderately heavy tail with almost none."""
        heavy = self.pareto_k > K_LIMIT and self.ess < ESS_LIMIT
        starved = self.pareto_k > K_MODERATE and self.ess < ESS_FLOOR
        return bool(heavy or starved)


def effective_sample_fraction(log_ratios) -> float:
    """``(sum r)^2 / (S sum r^2)`` of the ratios ``r = exp(log_ratios)`` (non-finite
    ones count as zero weight); NaN when none is finite."""
    lr = np.asarray(log_ratios, np.float64).ravel()
    finite = lr[np.isfinite(lr)]
    if finite.size == 0:
        return float("nan")
    w = np.exp(finite - finite.max())
    return float(w.sum() ** 2 / (w @ w) / lr.size)


def spread_of(log_ratios, draws: dict, from_q=None) -> Spread | None:
    """The narrowest of :func:`spreads_of`."""
    return spreads_of(log_ratios, draws, from_q)[0]


def spreads_of(log_ratios, draws: dict, from_q=None) -> tuple[Spread | None, Spread | None]:
    """``(narrowest, widest)``: the coordinates of ``draws`` (site -> ``(S, *shape)``)
    where q's sd is smallest and largest against the importance-weighted sd, each among
    those that differ by :func:`spread_z_limit` standard errors or more in its direction
    (else the smallest, or largest, ratio overall); Nones without draws. A widest's ``z``
    is negative (the weighted variance is the smaller).

    ``log_ratios``: ``log p - log g`` of each draw under the density g it was drawn
    from; ``from_q``: which draws are q's own (all when None, g = q). q's variance is
    that of its own draws; the weighted variance uses them all.

    Weights: the ratios truncated at ``sqrt(S)`` times their mean (Ionides 2008,
    Sec. 2), self-normalised. The standard error of ``log v_w - log v_q`` (weighted
    variance of all ``S`` draws, plain variance of q's ``S_q``) is the delta method's:
    the sd over draws of ``S w_s (d_s^2 / v_w - 1) - (S / S_q) [s from q] (e_s^2 / v_q -
    1)``, over ``sqrt(S)``, with ``d`` and ``e`` the deviations from the weighted mean
    and from q's draws' mean.
    """
    lr = np.asarray(log_ratios, np.float64)
    finite = np.isfinite(lr)
    from_q = np.ones(lr.shape, bool) if from_q is None else np.asarray(from_q, bool)
    if not draws or finite.sum() < 25 or (finite & from_q).sum() < 25:
        return None, None
    labels, columns = [], []
    for name in sorted(draws):
        x = np.asarray(draws[name], np.float64)
        shape = x.shape[1:]
        columns.append(x.reshape(x.shape[0], -1)[finite])
        labels += [name] if not shape else [f"{name}{list(i)}" for i in np.ndindex(shape)]
    x, lr, own = np.concatenate(columns, axis=1), lr[finite], from_q[finite]
    ratio, z = _ratio_and_z(x, lr, own)
    if not np.isfinite(ratio).any():
        return None, None
    z_limit = spread_z_limit(len(labels))
    finite = np.isfinite(ratio)

    def pick(sign):  # sign 1: the narrowest, -1: the widest
        significant = finite & (sign * z >= z_limit)
        pool = significant if significant.any() else finite
        i = int(np.argmin(np.where(pool, sign * ratio, np.inf)))
        return Spread(labels[i].replace(" ", ""), float(ratio[i]), float(z[i]), z_limit)

    return pick(1.0), pick(-1.0)


def _ratio_and_z(x, log_ratios, own):
    """q's sd over the weighted sd per column of ``x`` (inf where either variance is 0),
    and the log-variance difference in standard errors (:func:`spread_of`)."""
    w = np.exp(log_ratios - log_ratios.max())
    w = np.minimum(w, w.mean() * np.sqrt(w.size))
    w = w / w.sum()
    s = x.shape[0]
    v_q = x[own].var(0)
    d = x - w @ x
    v_w = w @ d**2
    ok = (v_q > 0) & (v_w > 0)
    v_q, v_w = np.where(ok, v_q, 1.0), np.where(ok, v_w, 1.0)
    e2 = np.where(own[:, None], (x - x[own].mean(0)) ** 2 / v_q - 1.0, 0.0)
    b = s * w[:, None] * (d**2 / v_w - 1.0) - s / own.sum() * e2
    z = (np.log(v_w) - np.log(v_q)) / np.maximum(np.sqrt((b**2).sum(0)) / s, 1e-300)
    return np.where(ok, np.sqrt(v_q / v_w), np.inf), np.where(ok, z, 0.0)


def check_importance(model, data: dict, schedule, guide_of, natural, params: dict, rng_key):
    """An :class:`ImportanceCheck` of q (``guide_of(natural)``, as
    :func:`log_importance_ratios`), or None where the check does not apply (module
    docstring)."""
    graph = schedule.user_graph or schedule.graph
    subsampled = any(f.subsampled for f in schedule.factors.values())
    summed = summed_site(graph)
    if (
        schedule.integrated
        # local latents of a subsampled plate: q holds all N of them, p a batch's
        or (subsampled and any(node.subsample_axes for node in schedule.nodes.values()))
        or any(
            v.discrete and (v.plates or v.batch_shape) and (summed is None or n != summed.name)
            for n, v in graph.variables.items()
            if not v.observed
        )
    ):
        return None
    latent = sum(
        int(np.prod(node.layout.shape))
        for name, node in schedule.nodes.items()
        if summed is None or name != summed.name
    )
    data_size = sum(int(np.size(v)) for v in data.values() if isinstance(v, np.ndarray | jax.Array))
    # Each draw evaluates the whole log joint: fewer draws for large data, none where
    # even MIN_DRAWS would cost more than MAX_WORK element evaluations, or where q has
    # more than MAX_COORDINATES coordinates (its ratios' ESS then measures the
    # dimension more than q's fit).
    num_draws = min(NUM_DRAWS, MAX_WORK // max(data_size, 1))
    if latent > MAX_COORDINATES or num_draws < MIN_DRAWS:
        return None
    if subsampled:
        # p on the whole data (the ratio q was fitted for; its minibatches estimate it)
        model = full_plates(model)
    keep = latent <= SPREAD_MAX_COORDINATES
    # The spread's defensive draws, as many as q's, where the data are small enough.
    defensive = num_draws if keep and num_draws * data_size <= DEFENSIVE_WORK else 0
    sampler = importance_sampler(model, data, params, guide_of, num_draws, keep, defensive, summed)
    try:
        ratios, draws, weights = sampler(natural, rng_key)
    except Exception:  # noqa: BLE001 - a q or model numpyro cannot evaluate so: no claim
        return None
    from_q = np.arange(num_draws + defensive) < num_draws
    narrowest, widest = spreads_of(weights, draws, from_q)
    looks = 1
    if keep and _undecided(narrowest, widest):
        # The second look (module docstring): the same program with other keys, the first
        # look's draws among them; the Pareto-k and ESS stay the first look's.
        per_look = num_draws + defensive
        looks += min(
            SECOND_LOOK_DRAWS,
            SECOND_LOOK_ELEMENTS // (per_look * latent),
            SECOND_LOOK_WORK // (per_look * max(data_size, 1)),
        )
        more = [sampler(natural, jax.random.fold_in(rng_key, i)) for i in range(1, looks)]
        weights = np.concatenate([weights, *(m[2] for m in more)])
        draws = {k: np.concatenate([v, *(m[1][k] for m in more)]) for k, v in draws.items()}
        narrowest, widest = spreads_of(weights, draws, np.tile(from_q, looks))
    return ImportanceCheck(
        pareto_k(ratios),
        effective_sample_fraction(ratios),
        num_draws,
        narrowest,
        defensive,
        tuple(n for n, v in graph.variables.items() if v.discrete and not v.observed),
        widest,
        looks,
        None if summed is None else summed.name,
    )


def _undecided(narrowest: Spread | None, widest: Spread | None) -> bool:
    """A coordinate past its limit (too narrow or too wide) at :data:`SECOND_LOOK_Z` to
    its z limit standard errors: the spread needs more draws to say."""
    narrow = narrowest is not None and narrowest.ratio < SPREAD_LIMIT
    wide = widest is not None and widest.ratio > WIDE_LIMIT
    return bool(
        (narrow and SECOND_LOOK_Z <= narrowest.z < narrowest.z_limit)
        or (wide and SECOND_LOOK_Z <= -widest.z < widest.z_limit)
    )


# Why a coordinate is too narrow, by its kind (warn_importance).
_GAUSSIAN_NARROW = (
    "The posterior is not Gaussian in that latent's unconstrained coordinate (typically a "
    "hierarchy's scale, or a skewed or bounded latent): its intervals from q are too short, "
    "and the latents coupled to it may be off too. Compare with NUTS, or try the other "
    "parameterisation of a hierarchy (non-centred where the data say little about each "
    "group, centred where they say much)."
)
_SUMMED = (
    " The check summed the discrete latent {site!r} out of the model: q keeps it "
    "independent of the continuous latents (mean-field, one assignment distribution per "
    "element), which narrows them where the assignments are uncertain (overlapping "
    "mixture components). Write the model with {site!r} summed out (a MixtureSameFamily "
    "likelihood, or a logsumexp over its values in a numpyro.factor): q is then fitted to "
    "the marginal posterior."
)
_GAUSSIAN_WIDE = (
    "The posterior is not Gaussian in that latent's unconstrained coordinate (typically a "
    "latent whose posterior piles against the edge of its support, a scale near zero or a "
    "truncated prior's bound): q's intervals there are too long and its mean may lean "
    "into the long tail. Compare with NUTS, or reparameterise that latent so that its "
    "posterior is nearer a Gaussian in the unconstrained space."
)
_DISCRETE_NARROW = (
    "That latent is discrete and q keeps it independent of the continuous latents "
    "(mean-field): where the posterior couples them (a switchpoint and the rates on either "
    "side of it), q's probabilities are too concentrated and its intervals too short. For "
    "the exact marginal, sum the discrete latent out of the model (a logsumexp over its "
    "values in a numpyro.factor) or compare with enumeration."
)


def _summed_note(check: ImportanceCheck) -> str:
    return "" if check.summed_site is None else _SUMMED.format(site=check.summed_site)


def warn_importance(check: ImportanceCheck | None):
    """A :class:`FitWarning` when ``check`` says q misses posterior mass, or (else) that
    q is too narrow at some coordinate, or (else) too wide at one."""
    if check is None:
        return
    if not check.misses_posterior:
        if check.too_narrow:
            n = check.narrowest
            discrete = n.coordinate.split("[")[0] in check.discrete_sites
            warnings.warn(
                f"q is too narrow at {n.coordinate!r}: its sd there is {n.ratio:.2f} of the "
                f"importance-weighted sd of "
                + check.spread_draws()
                + f" ({n.z:.1f} standard errors; the posterior may be wider still). "
                + (_DISCRETE_NARROW if discrete else _GAUSSIAN_NARROW)
                + _summed_note(check)
                + " result.diagnostics.importance holds the numbers.",
                FitWarning,
                stacklevel=3,
            )
        elif check.too_wide:
            w = check.widest
            warnings.warn(
                f"q is too wide at {w.coordinate!r}: its sd there is {w.ratio:.2f} times the "
                f"importance-weighted sd of "
                + check.spread_draws()
                + f" ({-w.z:.1f} standard errors). "
                + _GAUSSIAN_WIDE
                + " result.diagnostics.importance holds the numbers.",
                FitWarning,
                stacklevel=3,
            )
        return
    warnings.warn(
        f"q misses part of the posterior: of {check.num_draws} draws from q, a few carry "
        f"most of the importance weight p/q (effective sample size {check.ess:.1%} of "
        f"them; Pareto-k of the weights' tail {check.pareto_k:.2f}, Yao et al. 2018: "
        f"heavy above {K_LIMIT}). q's means and sds can be far off: typically a funnel (a "
        "centred hierarchy or latent volatility with its scale), a skewed scale, or "
        "latents q keeps independent that the posterior couples. Compare with NUTS, or "
        "try the other parameterisation of a hierarchy (non-centred where the data say "
        "little about each group, centred where they say much: a non-centred "
        "hierarchy with well-identified groups couples its scale to every group's "
        "offsets)." + _summed_note(check) + " result.diagnostics.importance holds the numbers.",
        FitWarning,
        stacklevel=3,
    )
