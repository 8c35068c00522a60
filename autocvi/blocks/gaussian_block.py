"""Gaussian blocks: a Gaussian node kept as its prior plus likelihood sites.

A Gaussian latent qualifies when (DESIGN.md "Gaussian blocks"):

* its q is one joint Gaussian over the whole site (no plates, no transform);
* its only conjugate factor is its own prior, whose parameters are constants;
* every other factor touching it touches no other latent, is not subsampled,
  and sees it only through an affine predictor per element
  (``eta = A x + b``; Gauss-Hermite messages).

Then the node's state is one site ``(lam1_n, lam2_n)`` per predictor element,
O(N) numbers (CVI paper Alg. 1; KL-prox Sec. 5), and the node's posterior is
recomputed from the prior and the sites by a solver chosen from structure
(:mod:`autocvi.gaussian_solvers`):

* ``markov``: the prior's precision is tridiagonal (GaussianRandomWalk, an
  AR(1) written as a scan, iid) and each element of the predictor reads one
  state: O(T);
* ``function-space``: a dense kernel prior (a whitened MultivariateNormal) or
  more latent dimensions than sites (D > N): N x N, no D x D matrix;
* ``weight-space``: otherwise (D <= N): D x D.

The structure is read numerically from the factors' log densities, never from
the model's name: the prior's precision by Hessian-vector products (a probe
per colour of a 3-colouring recovers a tridiagonal matrix; a random probe
verifies the pattern), the predictor's matrix by a Jacobian or, when every
element reads one state, by one Jacobian-vector product plus a random check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import Distribution, constraints

from ..analysis.layout import site_posterior
from ..analysis.linear_predictor import LinearPredictor
from ..analysis.objectives import expected_log_likelihood
from ..jaxpr import structural_jit
from ..model.message_kinds import EXACT
from . import solvers as gs
from .block_solvers import BLOCK_SOLVERS, BlockSolver

__all__ = ["GaussianBlock", "find_block", "BlockPosterior"]

# Pairs of past sites and targets the step's Anderson extrapolation combines.
ANDERSON_MEMORY = 5
# Ridge of its least squares, relative to the mean squared residual difference.
ANDERSON_RIDGE = 1e-8
# Largest predictor Jacobian (elements) formed for the dense solvers.
_MAX_JACOBIAN = 50_000_000
# Blocks up to this dimension report a numpyro MultivariateNormal posterior;
# larger ones a BlockPosterior (exact moments, draws, log density; no D x D matrix).
_MAX_DENSE_POSTERIOR = 1000


@dataclass(frozen=True)
class _Term:
    """One likelihood factor of the block: eta = A x + b and l(eta) per element."""

    factor: str
    eta_shape: tuple[int, ...]
    rest: Any = field(repr=False)  # eta (eta_shape) -> per-element log density
    A: Any = field(default=None, repr=False)  # (N, D) dense, or None
    a: Any = field(default=None, repr=False)  # (D,) when eta_t = a_t x_t + b_t
    b: Any = field(default=None, repr=False)  # (N,)
    # Variance per element added to eta's (an integrated conditional's residual:
    # LinearPredictor.point_rest), 0 for none.
    residual: Any = field(default=0.0, repr=False)
    # (rest, mean, var) -> reward per element: E[l] or the objective's (FactorPlan.expected)
    expected: Callable = field(default=expected_log_likelihood, repr=False)
    # The reward reads the predictor's mean only (square-loss DLM): GaussianBlock.update
    # steps its sites by Newton on the mean.
    mean_only: bool = False
    # The reward's gradient is a sampling estimate (DLM's bMC, uPS): its value is
    # computed apart (GaussianBlock.update).
    sampled: bool = False
    # The factor's LinearPredictor: the arrays above are read from it again for new
    # data (GaussianBlock.data_arrays).
    predictor: Any = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return int(np.prod(self.eta_shape))

    @property
    def newton_mean(self) -> bool:
        """The reward is a log loss ``log E_q[exp l]`` (log-loss DLM), whose curvature in
        the predictor's mean is not CVI's site precision: the block steps its mean by
        Newton (:meth:`GaussianBlock._alternating_update`). Not with a sampled gradient
        (bMC, uPS): a Newton step takes the estimate at full weight every iteration, and
        on the probit sets of ``benchmarks/dlm_nonconjugate.py`` the uPS fits' test NLL
        rose by 0.014-0.020 with it; those keep CVI's joint step."""
        return (
            self.expected is not expected_log_likelihood and not self.mean_only and not self.sampled
        )


@dataclass(frozen=True)
class GaussianBlock:
    """How a Gaussian node's posterior is computed from its prior and sites."""

    name: str
    solver: str  # a key of BLOCK_SOLVERS: "weight-space" | "function-space" | "markov"
    # The factors whose sum is the Gaussian prior: the site's own prior, or the
    # members' priors of a joint group (autocvi.analysis.joint).
    prior_factors: tuple[str, ...]
    terms: tuple[_Term, ...]
    layout: Any = field(repr=False)
    dim: int = 0
    # diagonal prior: x = m0 + sd0 * u, u ~ N(0, I); a dense prior (a joint
    # group's hierarchy): x = m0 + L0 u with L0 L0^T the prior covariance;
    # markov prior: (q_diag, q_off, h)
    prior: dict = field(default_factory=dict, repr=False)
    # Sites of negative precision are kept, not clipped (a DLM objective's terms; the
    # solver then must take them: BlockSolver.signed_sites).
    signed_sites: bool = False

    @property
    def factors(self) -> tuple[str, ...]:
        return self.prior_factors + tuple(t.factor for t in self.terms)

    @property
    def method(self) -> BlockSolver:
        """The solver this block uses (:mod:`autocvi.blocks.block_solvers`)."""
        return BLOCK_SOLVERS[self.solver]

    # The prior of the weight- and function-space solvers: x = m0 + T0 u, u ~ N(0, I),
    # with T0 = diag(sd0) or the dense factor L0 (upper triangular).
    def whitened_to_x(self, u):
        """x - m0 from whitened u (``(..., D)``): ``sd0 * u`` or ``L0 u``."""
        if "L0" in self.prior:
            return jnp.einsum("ij,...j->...i", self.prior["L0"], u)
        return self.prior["sd0"] * u

    def x_to_whitened(self, x):
        """u from x (``(..., D)``): the inverse of :meth:`whitened_to_x` after ``- m0``."""
        r = x - self.prior["m0"]
        if "L0" in self.prior:
            flat = jnp.reshape(r, (-1, self.dim)).T
            u = jax.scipy.linalg.solve_triangular(self.prior["L0"], flat, lower=False)
            return jnp.reshape(u.T, r.shape)
        return r / self.prior["sd0"]

    def rows_times_prior_factor(self, a):
        """``a T0`` for rows ``a`` (``(M, D)``): what ``a x`` is as a function of u."""
        if "L0" in self.prior:
            return a @ self.prior["L0"]
        return a * self.prior["sd0"][None]

    @property
    def log_det_prior_factor(self):
        """``log |det T0|``."""
        if "L0" in self.prior:
            return jnp.sum(jnp.log(jnp.abs(jnp.diagonal(self.prior["L0"]))))
        return jnp.sum(jnp.log(self.prior["sd0"]))

    @property
    def num_sites(self) -> int:
        return sum(t.size for t in self.terms)

    def describe(self) -> str:
        return f"{self.solver} sites ({self.num_sites} sites, D = {self.dim})"

    # ------------------------------------------------------------ new data
    def data_arrays(self, values: dict, whitening=None):
        """``(arrays, ok)``: the arrays of this block that the data decide, read from
        ``values`` (the factors' inputs: data and params; tracers inside a compiled
        program) with the structure chosen when the block was found.

        ``arrays``: per term its predictor's offset ``b`` and matrix ``A`` or
        per-element slopes ``a`` (``eta = A x + b``), and the prior's arrays that
        involve them (:func:`_predictor_prior`). ``ok``: the structure still holds for
        these values (a term read as one state per element, ``eta_t = a_t x_t + b_t``,
        still is: the random-probe check :func:`find_block` made). ``whitening``: the
        ``(loc, scale_tril)`` of a whitened site's own MultivariateNormal prior at
        these values (a GP's kernel at new inputs): the site is ``loc + scale_tril x``
        with x ~ N(0, I) a priori whatever they are, so only the predictors move.
        Otherwise the prior (its precision, mean and factor) is not read again: the
        caller keeps data that such a prior reads baked into the plan (``autocvi.CVI``).
        """
        name = self.name
        lay = self.layout if whitening is None else replace(self.layout, whitening=whitening)
        dtype = jnp.result_type(float)
        x0 = jnp.zeros((self.dim,), dtype)
        probe = jnp.asarray(_probe(self.dim, dtype))
        rel = _relative_tolerance(dtype)
        ok = jnp.asarray(True)
        terms = []
        for t in self.terms:

            def eta_flat(x, lp=t.predictor):
                return jnp.reshape(lp.eta_fn({**values, name: lay.to_site(x)}), (-1,))

            b, jvp = jax.linearize(eta_flat, x0)
            entry = {"b": b}
            if t.a is not None:
                a, lin = jvp(jnp.ones_like(x0)), jvp(probe)
                ok = ok & jnp.all(jnp.abs(a * probe - lin) <= rel * (1 + jnp.max(jnp.abs(lin))))
                entry["a"] = a
            if t.A is not None:
                entry["A"] = jax.jacfwd(eta_flat)(x0)
            terms.append(entry)
        prior = {}
        if "At" in self.prior:
            A = jnp.concatenate([e["A"] for e in terms])
            b = jnp.concatenate([e["b"] for e in terms])
            prior = _predictor_prior(self.prior, A, b, function_space="K" in self.prior)
        arrays = {"terms": tuple(terms), "prior": prior}
        if whitening is not None:
            arrays["whitening"] = tuple(whitening)
        return arrays, ok

    def with_data(self, values: dict, arrays: dict) -> GaussianBlock:
        """This block for other data: ``arrays`` from :meth:`data_arrays` of the same
        ``values``, and each term's log density per element reading ``values``."""
        terms = []
        for t, entry in zip(self.terms, arrays["terms"], strict=True):
            rest, residual = t.predictor.point_rest(values)
            terms.append(
                replace(
                    t,
                    rest=rest,
                    residual=jnp.ravel(jnp.broadcast_to(residual, t.eta_shape)),
                    **entry,
                )
            )
        layout = self.layout
        if "whitening" in arrays:
            layout = replace(layout, whitening=arrays["whitening"])
        return replace(
            self, terms=tuple(terms), prior={**self.prior, **arrays["prior"]}, layout=layout
        )

    @property
    def whitened_own_prior(self) -> bool:
        """The block's prior is its site's own MultivariateNormal, whitened: N(0, I) on
        the block's coordinates whatever the prior's parameters (data it reads are
        read again by :meth:`data_arrays`)."""
        return self.layout.whitening is not None and self.prior_factors == (self.name,)

    # ------------------------------------------------------------ the state
    def init_sites(self, dtype=None) -> dict:
        """Unit-precision pseudo-observations at 0 for every element.

        A zero site (q = prior) can put ``E_q[exp(eta)]`` out of range when the
        prior is wide (a long random walk); one unit of pseudo-precision per
        element keeps every predictor's variance at most 1 to start with.
        """
        dtype = dtype or jnp.result_type(float)
        return {
            t.factor: (jnp.zeros((t.size,), dtype), jnp.full((t.size,), -0.5, dtype))
            for t in self.terms
        }

    def _stacked(self, sites):
        lam1 = jnp.concatenate([sites[t.factor][0] for t in self.terms])
        lam2 = jnp.concatenate([sites[t.factor][1] for t in self.terms])
        return lam1, lam2

    def solve(self, sites):
        """Posterior marginals of every predictor element, and the solver's factors."""
        lam1, lam2 = self._stacked(sites)
        return self.method.solve(self, lam1, lam2)

    def _split(self, x):
        out, start = {}, 0
        for t in self.terms:
            out[t.factor] = x[start : start + t.size]
            start += t.size
        return out

    def expected_log_likelihood(self, marginals: gs.SiteMarginals):
        """sum_n E_{N(eta_n | m_n, v_n)}[log p_n(eta_n)] by 32-node Gauss-Hermite."""
        means, variances = self._split(marginals.mean), self._split(marginals.var)
        return sum(_gh_expectation(t, means[t.factor], variances[t.factor]) for t in self.terms)

    @property
    def cacheable(self) -> bool:
        """Whether a step's direction is a function of the sites alone (no term's gradient
        is a sampling estimate), so the line search's trial can hand it to the next step."""
        return not any(t.sampled for t in self.terms)

    def empty_cache(self, sites, memory: int = ANDERSON_MEMORY) -> dict:
        """A :meth:`update` cache that matches no sites (NaN never equals anything),
        with room for ``memory`` past steps of Anderson extrapolation (0: plain CVI
        steps)."""
        nan = jax.tree_util.tree_map(lambda x: jnp.full_like(x, jnp.nan), sites)
        zero = jnp.zeros((), jnp.result_type(float))
        flat = jax.flatten_util.ravel_pytree(sites)[0]
        history = jnp.zeros((memory, flat.size), flat.dtype)
        return {
            "sites": nan,
            "elbo": zero,
            "target": nan,
            # The accepted sites and their targets, newest last (Anderson acceleration).
            "points": history,
            "targets": history,
            "count": jnp.zeros((), jnp.int32),
            "step": jnp.ones((), zero.dtype),
        }

    def _value_and_target(self, sites, key=None):
        """The block's ELBO term at ``sites`` and the CVI step's target sites there.

        ``g_n`` is the natural gradient of the expected log likelihood of
        element n w.r.t. the mean parameters ``(m_n, m_n^2 + v_n)`` of its
        predictor: ``lam2 = dE/dv``, ``lam1 = dE/dm - 2 m dE/dv`` (CVI App. B.1).
        """
        value, parts = self._moments_and_slopes(sites, key)
        target = {}
        for f, (m, _, gm, lam2, _) in parts.items():
            lam1 = gm - 2.0 * lam2 * m
            old1, old2 = sites[f]
            ok = jnp.isfinite(lam1) & jnp.isfinite(lam2)
            target[f] = (jnp.where(ok, lam1, old1), jnp.where(ok, lam2, old2))
        if any(t.mean_only for t in self.terms):
            means = {f: part[0] for f, part in parts.items()}
            variances = {f: part[1] for f, part in parts.items()}
            target = self._mean_newton_targets(target, means, variances)
        return value, target

    def update(self, sites, beta, key=None, cache=None):
        """One CVI step on the sites: lam_n <- (1 - beta) lam_n + beta g_n (CVI Alg. 1),
        with ``g_n`` from :meth:`_value_and_target`.

        Sites with positive curvature (``lam2 > 0``: a non-log-concave
        likelihood) are clipped at zero precision, which the function-space solver
        needs, unless the block keeps signed sites (:attr:`signed_sites`: a DLM
        objective, whose optimum has them wherever an observation lies outside its
        predictive spread); non-finite messages leave their site unchanged.

        Safeguard: the step is halved (up to 12 times) while it would lower the
        ELBO or make it non-finite, and dropped if no halving helps. A full
        CVI step is a Newton step on each predictor, which from far away
        overshoots for exp-like likelihoods (a Poisson rate exp(eta) with counts
        in the thousands); the safeguard makes every step an ascent step.

        ``cache`` (:meth:`empty_cache`, for a :attr:`cacheable` block): the line
        search evaluates its candidates with the gradient too, and keeps the
        accepted one's. When the next step starts from exactly those sites (as it
        does inside a run), it starts from the cached ELBO and target instead of
        solving and integrating again: one pass over the data per step instead of
        two (logistic regression, N = 683, D = 11: 0.26 -> 0.20 ms a step when it was
        introduced). The cache assumes the block's data did not change between the two
        steps (a step on new data whose sites equal the cached
        ones takes one step towards the old data's target; the line search still
        makes it an ascent step, and the next step is fresh).

        ``key``: the draws of an objective whose gradient is a sampling estimate (DLM's
        bMC or uPS); the values the line search compares are deterministic.

        Returns the new sites, the block's ELBO term at them, the step taken (0:
        refused) and the new cache (None without ``cache``).
        """
        # A log-loss DLM term: Newton on the mean, then CVI on the precision.
        if any(t.newton_mean for t in self.terms):
            return self._alternating_update(sites, beta, key, cache)
        if cache is None:
            return self._searched_update(sites, beta, key)
        return self._cached_update(sites, beta, cache)

    def _mix(self, sites, target, b):
        return {
            f: (
                (1.0 - b) * sites[f][0] + b * target[f][0],
                (1.0 - b) * sites[f][1] + b * target[f][1],
            )
            for f in sites
        }

    def _slack(self, old_elbo):
        """How far below the old ELBO a step may land and still count as no worse.

        Ties within rounding are accepted (float32 ELBOs carry ~1e-7 relative noise),
        but nothing larger than fit's convergence tolerance (1e-6 relative): a looser
        slack let full steps cycle around the optimum.
        """
        rel = (0.0 if self.signed_sites else 1e-10) if old_elbo.dtype == jnp.float64 else 1e-6
        return rel * (1.0 + jnp.abs(old_elbo))

    @staticmethod
    def _bad(value, old_elbo, slack):
        return ~jnp.isfinite(value) | (value < old_elbo - slack)

    def _searched_update(self, sites, beta, key):
        """:meth:`update` without a cache: the direction at ``sites`` (``key``: a sampled
        objective's draws), then a line search on the deterministic ELBO alone."""
        old_elbo, target = self._value_and_target(sites, key)
        slack = self._slack(old_elbo)

        # One loop evaluates every candidate, the full step (k = -1) and each halving:
        # the block's ELBO appears once in the compiled step, not once per call site.
        def attempt(carry):
            b, k, _, _ = carry
            b = jnp.where(k < 0, b, 0.5 * b)
            candidate = self._mix(sites, target, b)
            return b, k + 1, self.elbo(candidate), candidate

        b0 = jnp.asarray(beta, old_elbo.dtype)
        b, _, value, candidate = jax.lax.while_loop(
            lambda c: (c[1] < 0) | ((c[1] < 12) & self._bad(c[2], old_elbo, slack)),
            attempt,
            (b0, jnp.asarray(-1, jnp.int32), old_elbo, sites),
        )
        accept = ~self._bad(value, old_elbo, slack)
        out = _where_tree(accept, candidate, sites)
        return out, jnp.where(accept, value, old_elbo), jnp.where(accept, b, 0.0), None

    def _cached_update(self, sites, beta, cache):
        """:meth:`update` with a cache: every evaluation, the sites' own on a miss
        included, is one ``_value_and_target`` call in one loop, so the compiled step
        holds the block's pass over the data once (its compilation was a third of a
        Gaussian-block fit's cold time).

        The first candidate is Anderson's extrapolation (:func:`_anderson`) from the
        accepted sites and targets of the last steps, when there are any: CVI's step is a
        fixed-point iteration ``lam <- g(lam)`` that contracts slowly where q is far from
        the likelihood's quadratic regime (a kernel with variance e^12 on sonar: ~430
        steps to 0.1 nat), and the extrapolation is a secant method on it. If it does not
        raise the ELBO, the plain step and its halvings follow and the history restarts.
        The plain step starts at twice the size last accepted (at most ``beta``). A cache
        without history (``memory=0``) takes plain CVI steps from ``beta``.
        """
        same = jnp.all(
            jnp.stack(
                [
                    jnp.all(a == b)
                    for a, b in zip(
                        jax.tree_util.tree_leaves(sites),
                        jax.tree_util.tree_leaves(cache["sites"]),
                        strict=True,
                    )
                ]
            )
        )
        beta = jnp.asarray(beta, cache["elbo"].dtype)
        memory = cache["points"].shape[0]
        # The plain step starts at twice the last accepted halving, not at beta: where
        # full steps overshoot (sonar's slow tail accepts 1/32 to 1/64 of one) each
        # step would otherwise spend five or six evaluations finding it again.
        b0 = jnp.minimum(beta, 2.0 * cache["step"]) if memory else beta
        flat_sites, unravel = jax.flatten_util.ravel_pytree(sites)
        extrapolate = (cache["count"] > 0) & (memory > 0)

        def candidate_at(k, target):
            """k = -2: the sites themselves (a cache miss only), k = -1: the
            extrapolation, k >= 0: the plain step halved k times."""
            b = b0 * 0.5 ** jnp.maximum(k, 0).astype(b0.dtype)
            flat_target = jax.flatten_util.ravel_pytree(target)[0]
            plain = self._mix(sites, target, b)
            if memory:
                jumped = unravel(_anderson(flat_sites, flat_target, cache))
                if not self.signed_sites:
                    jumped = {f: (a, jnp.minimum(p, 0.0)) for f, (a, p) in jumped.items()}
                plain = _where_tree(k == -1, jumped, plain)
            return b, _where_tree(k == -2, sites, plain)

        def attempt(carry):
            k, _, old_elbo, target, _, _, _ = carry
            k = jnp.where(k == -3, -2, jnp.where(k == -2, jnp.where(extrapolate, -1, 0), k + 1))
            b, candidate = candidate_at(k, target)
            value, new_target = self._value_and_target(candidate)
            at_sites = k == -2
            old_elbo = jnp.where(at_sites, value, old_elbo)
            target = _where_tree(at_sites, new_target, target)
            return k, b, old_elbo, target, value, new_target, candidate

        def again(carry):
            k, _, old_elbo, _, value, _, _ = carry
            return (k <= -2) | ((k < 12) & self._bad(value, old_elbo, self._slack(old_elbo)))

        start = (
            jnp.where(same, -2, -3).astype(jnp.int32),
            b0,
            cache["elbo"],
            cache["target"],
            cache["elbo"],
            cache["target"],
            sites,
        )
        k, b, old_elbo, target, value, new_target, candidate = jax.lax.while_loop(
            again, attempt, start
        )
        accept = ~self._bad(value, old_elbo, self._slack(old_elbo))
        out = _where_tree(accept, candidate, sites)
        value = jnp.where(accept, value, old_elbo)
        # The history gains the step's starting point; a refused extrapolation (or
        # step) restarts it there.
        flat_target = jax.flatten_util.ravel_pytree(target)[0]
        restart = (extrapolate & (k != -1)) | ~accept
        count = jnp.minimum(jnp.where(restart, 1, cache["count"] + 1), memory)
        # The sites returned, bit for bit, with their ELBO and target: the next step
        # starts from them.
        new_cache = {
            "sites": out,
            "elbo": value,
            "target": _where_tree(accept, new_target, target),
            "points": _pushed(cache["points"], flat_sites),
            "targets": _pushed(cache["targets"], flat_target),
            "count": jnp.where(accept, count, 0),
            # the plain step's accepted size (an extrapolation leaves it; a refusal resets)
            "step": jnp.where(accept & (k >= 0), b, jnp.where(accept, cache["step"], beta)),
        }
        return out, value, jnp.where(accept, b, 0.0), new_cache

    def _moments_and_slopes(self, sites, key=None, curvature=False):
        """The block's objective at ``sites`` (the CVI step's and the log-loss DLM step's), each term's predictor means and
        variances, the reward's gradients ``(dr/dm, dr/dv)`` there (a sampling estimate
        where the objective's is; ``key``: its draws) and, with ``curvature``, each
        element's ``c = d^2 r / dm^2`` of the deterministic reward, clipped at 0."""
        marginals, _ = self.solve(sites)
        lam1_old, lam2_old = self._stacked(sites)
        means, variances = self._split(marginals.mean), self._split(marginals.var)
        expected, parts = 0.0, {}
        for k, t in enumerate(self.terms):
            m, v = means[t.factor], variances[t.factor]
            tkey = None if key is None else jax.random.fold_in(key, k)
            value, (gm, gv) = jax.value_and_grad(
                lambda mm, vv, t=t, tkey=tkey: _gh_expectation(t, mm, vv, tkey), argnums=(0, 1)
            )(m, v)
            if t.sampled:
                # A sampled-gradient objective's surrogate (DLM's bMC, uPS) carries its
                # estimate in the value's derivative, and a non-finite estimate would
                # make the value NaN; the line search compares the deterministic one.
                value = _gh_expectation(t, m, v)
            expected = expected + value
            # The value and the gradients in one pass over the nodes (a separate
            # evaluation of the value cost a fifth of a step).
            if not self.signed_sites:
                gv = jnp.minimum(gv, 0.0)
            c = None
            if curvature:
                if t.expected is not expected_log_likelihood:
                    slope = jax.grad(lambda mm, t=t, v=v: _gh_expectation(t, mm, v))
                    c = jnp.minimum(jax.jvp(slope, (m,), (jnp.ones_like(m),))[1], 0.0)
                else:
                    # E_q[l]: Bonnet's and Price's theorems, d^2 E / dm^2 = 2 dE / dv
                    c = jnp.minimum(2.0 * gv, 0.0)
            parts[t.factor] = (m, v, gm, gv, c)
        value = expected - gs.kl_from_sites(marginals, lam1_old, lam2_old)
        return value, parts

    # ------------------------------------------------------------ log-loss DLM
    def _searched(self, sites, old_elbo, candidate_at, b0):
        """The first of ``candidate_at(b0 / 2^k)``, k = 0..12, whose objective is not
        below ``old_elbo`` (within :meth:`_slack`): ``(sites, value, b)``, or the old
        sites with ``b = 0`` when none is."""
        slack = self._slack(old_elbo)

        def attempt(carry):
            b, k, _, _ = carry
            b = jnp.where(k < 0, b, 0.5 * b)
            candidate = candidate_at(b)
            return b, k + 1, self.elbo(candidate), candidate

        b, _, value, candidate = jax.lax.while_loop(
            lambda c: (c[1] < 0) | ((c[1] < 12) & self._bad(c[2], old_elbo, slack)),
            attempt,
            (b0, jnp.asarray(-1, jnp.int32), old_elbo, sites),
        )
        accept = ~self._bad(value, old_elbo, slack)
        return (
            _where_tree(accept, candidate, sites),
            jnp.where(accept, value, old_elbo),
            jnp.where(accept, b, 0.0),
        )

    def _alternating_update(self, sites, beta, key, cache):
        """:meth:`update` for a block with a log-loss DLM term: a Newton step on q's
        mean at fixed precision, then CVI's step on the precision at fixed mean, each
        with its own line search on the (deterministic) objective.

        Why: for ``r_n = E_q[l_n]`` (the ELBO, the beta-ELBO) Bonnet's and Price's
        theorems give ``d^2 r_n / dm_n^2 = 2 dr_n / dv_n`` (Khan & Lin,
        *Conjugate-Computation Variational Inference*, App. B.1), so the precision CVI's
        step gives q is the objective's Hessian in the mean, and a full step (Alg. 1,
        beta = 1) is a Newton step on the mean. For the log loss ``r_n = log Z_n / beta``,
        ``Z_n = E_q[p(y_n | f_n)]`` (Wei, Sheth & Khardon, *Direct Loss Minimization for
        Sparse Gaussian Processes*, Sec. 1-2), ``dZ_n / dv_n = Z_n'' / 2`` (q's density
        solves the heat equation), so ``d^2 r_n / dm_n^2 = 2 dr_n / dv_n - beta
        (dr_n / dm_n)^2``: CVI's curvature misses the squared gradient. An observation
        outside its predictive spread gets a site of negative precision, and q's
        precision falls far below the objective's curvature in the mean (a sparse GP on
        airfoil, beta = 0.0153, at the optimum: by up to 3,700 times), so CVI's joint step
        overshoots in the mean and the line search cut every step to 1/1000-1/2000 of
        one (~960 iterations, stopping ~10 nats short of the optimum).

        The mean step: pseudo-sites ``(g - c m, c / 2)`` from each element's gradient
        ``g = dr/dm`` and curvature ``c = d^2 r / dm^2`` (clipped at 0; exact for a
        log-concave likelihood, whose ``log Z`` is log-concave in m; ``2 dr/dv`` for an
        ``E_q[l]`` term) give, by one solve, the Newton step's means ``m*``. The
        candidates keep q's precision and move its mean along ``m + b (m* - m)``: each
        site's ``s_n = lam1_n + 2 lam2_n m_n`` (``sum_n a_n s_n = K^-1 (m - m0)`` at any
        sites, the solvers' ``P m = K^-1 m0 + sum_n a_n lam1_n``) moves linearly to
        ``g + c (m* - m)`` (Newton's condition ``K^-1 (m* - m0) = sum_n a_n (g_n + c_n
        (m*_n - m_n))``) and ``lam1 = s - 2 lam2 m(b)``. The precision step: CVI's
        ``lam2 <- (1 - b) lam2 + b dr/dv`` at the new sites, with ``lam1 = s - 2 lam2``
        ``m`` (the mean held), from twice the size last accepted (``cache["step"]``,
        at most ``beta``; the mean's step starts at ``beta``, 1 by default). Both are
        ascent steps for short enough ``b`` (Newton's direction; the natural gradient in
        the precision), and the fixed points are CVI's. On airfoil the mean's full step
        is accepted every iteration and the fit reaches Adam's final test NLPD in ~145
        iterations instead of ~430. The precision step is still CVI's, and still short
        (1/500-1/1000 of a step on airfoil): the objective's curvature in the sites'
        ``lam2`` is ``F (diag(h) F - I)``, ``F = 2 (S o S)``, ``S`` the predictors'
        covariance under q and ``h = d^2 r / dv^2``, far from CVI's ``-F`` where an
        outlier's ``h`` is large; a Gauss-Newton direction ``(I - diag(min(h, 0)) F)^-1``
        applied to CVI's would be the analogue of the mean's step (not done here).

        Returns what :meth:`update` returns; the cache (when given) carries the
        precision step's last accepted size only.
        """
        dtype = jax.flatten_util.ravel_pytree(sites)[0].dtype
        old_elbo, parts = self._moments_and_slopes(sites, key, curvature=True)
        pseudo = {f: (g - c * m, 0.5 * c) for f, (m, _, g, _, c) in parts.items()}
        ok = jnp.all(
            jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(pseudo)])
        )
        moved = self._split(self.solve(pseudo)[0].mean)
        ok = ok & jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in moved.values()]))

        def mean_candidate(b):
            out = {}
            for f, (l1, l2) in sites.items():
                m, _, g, _, c = parts[f]
                m_new = jnp.where(ok, moved[f], m)
                s_old = l1 + 2.0 * l2 * m
                s_new = jnp.where(ok, g + c * (m_new - m), s_old)
                m_b = m + b * (m_new - m)
                out[f] = ((1.0 - b) * s_old + b * s_new - 2.0 * l2 * m_b, l2)
            return out

        beta = jnp.asarray(beta, dtype)
        sites, value, _ = self._searched(sites, old_elbo, mean_candidate, beta)

        value, parts = self._moments_and_slopes(sites, key)
        b0 = beta if cache is None else jnp.minimum(beta, 2.0 * cache["step"])
        b0 = jnp.where(jnp.isfinite(b0) & (b0 > 0), b0, beta)

        def precision_candidate(b):
            out = {}
            for f, (l1, l2) in sites.items():
                m, _, _, gv, _ = parts[f]
                target = jnp.where(jnp.isfinite(gv), gv, l2)
                lam2 = (1.0 - b) * l2 + b * target
                out[f] = (l1 + 2.0 * (l2 - lam2) * m, lam2)
            return out

        sites, value, b = self._searched(sites, value, precision_candidate, b0)
        new_cache = None
        if cache is not None:
            new_cache = dict(cache, step=jnp.where(b > 0, b, beta))
        return sites, value, b, new_cache

    def _mean_newton_targets(self, target, means, variances):
        """Targets of the terms whose reward reads the predictor's mean only (square-loss
        DLM). Their CVI sites carry no precision (the reward's gradient w.r.t. ``v`` is
        0), so CVI's step alone is a Richardson iteration on the mean that crawls when
        the prior is wide against beta. Instead: one Newton step on the means, with
        pseudo-sites ``(g - c m, c / 2)`` from each element's gradient ``g`` and curvature
        ``c`` (exact for the square loss: the posterior mean under noise variance beta),
        then the sites at the new means ``m*``: ``(g(m*), 0)``, whose q has that mean and
        the prior's covariance (DLM paper, Sec. 3: the optimum depends on m only). The
        line search then moves the sites towards these targets as for any other term.
        """
        pseudo, newton = dict(target), [t for t in self.terms if t.mean_only]

        def slope(t, v):
            return jax.grad(lambda mm: _gh_expectation(t, mm, v))

        for t in newton:
            m, v = means[t.factor], variances[t.factor]
            g, c = jax.jvp(slope(t, v), (m,), (jnp.ones_like(m),))
            c = jnp.minimum(c, 0.0)
            ok = jnp.isfinite(g) & jnp.isfinite(c)
            pseudo[t.factor] = (jnp.where(ok, g - c * m, 0.0), jnp.where(ok, 0.5 * c, 0.0))
        moved = self._split(self.solve(pseudo)[0].mean)
        out = dict(target)
        for t in newton:
            g = slope(t, variances[t.factor])(moved[t.factor])
            old1, old2 = target[t.factor]
            ok = jnp.isfinite(g)
            out[t.factor] = (jnp.where(ok, g, old1), jnp.where(ok, jnp.zeros_like(g), old2))
        return out

    def elbo(self, sites):
        """E_q[log likelihood] - KL(q || prior) (the prior is the site's own density)."""
        marginals, _ = self.solve(sites)
        lam1, lam2 = self._stacked(sites)
        return self.expected_log_likelihood(marginals) - gs.kl_from_sites(marginals, lam1, lam2)

    # ------------------------------------------------------------ posterior
    def posterior_moments(self, sites):
        """Mean and marginal variance of x (the family layout of the site)."""
        _, aux = self.solve(sites)
        return self.method.moments(self, aux)

    def precision(self, sites):
        """Dense posterior precision of x (small blocks only)."""
        _, lam2 = self._stacked(sites)
        return self.method.precision(self, -2.0 * lam2)

    def natural(self, sites):
        """Natural parameters ``(P m, -P/2)`` of q on x (small blocks only)."""
        mean, _ = self.posterior_moments(sites)
        P = self.precision(sites)
        P = 0.5 * (P + P.T)
        return (P @ mean, -0.5 * P)

    def sample_x(self, sites, key, num_samples):
        """Draws of x from q without a D x D matrix."""
        _, aux = self.solve(sites)
        return self.method.sample(self, aux, key, num_samples)

    def posterior(self, sites):
        """q over the site's value: a MultivariateNormal when D is small, else a BlockPosterior."""

        if self.dim <= _MAX_DENSE_POSTERIOR:
            return site_posterior(self.layout, self.natural(sites))
        return BlockPosterior(self, sites, *self.site_moments(sites))

    def site_moments(self, sites):
        """Mean and marginal variance of the site's value (exact, no D x D matrix
        unless the prior itself is a dense kernel, whose factor L is then used)."""
        lay = self.layout
        mean_x, var_x = self.posterior_moments(sites)
        if lay.whitening is None:
            return lay.to_site(mean_x), jnp.reshape(var_x, lay.shape)
        # site = loc + L u with Cov_u = I - At^T s Bf^-1 s At (function space):
        # Var = rowsum(L^2) - rowsum((L V^T)^2), V = C^-1 s At.
        _, tril = lay.whitening
        _, (alpha, s, C) = self.solve(sites)
        V = jax.scipy.linalg.solve_triangular(C, s[:, None] * self.prior["At"], lower=True)
        LV = tril @ V.T
        var = jnp.sum(tril * tril, axis=1) - jnp.sum(LV * LV, axis=1)
        return lay.to_site(mean_x), jnp.reshape(var, lay.shape)


def _pushed(history, row):
    """``history`` (rows oldest first) with ``row`` appended and the oldest dropped."""
    if not history.shape[0]:
        return history
    return jnp.concatenate([history[1:], row[None]], axis=0)


def _anderson(x, g, cache, ridge=ANDERSON_RIDGE):
    """Anderson's extrapolation of the fixed-point iteration ``x <- g(x)`` (Walker and
    Ni, "Anderson acceleration for fixed-point iterations", 2011: Algorithm AA, mixing 1)
    from the current pair ``(x, g)`` and the last ``cache["count"]`` pairs in
    ``cache["points"]`` / ``cache["targets"]``: the affine combination of the pairs
    whose residual ``g - x`` is least in the 2-norm, mapped through ``g``. The least
    squares are ridge regularised (``ridge``, relative): without it the weights jump
    where the history is nearly colinear, and two compilations of the same loop (a run's
    and a step's) parted by whole nats after 50 steps from differences in rounding."""
    rows = cache["points"].shape[0]
    used = jnp.arange(rows) >= rows - cache["count"]
    r = g - x
    d = jnp.where(used[:, None], (cache["targets"] - cache["points"]) - r[None], 0.0)
    gram = d @ d.T
    ridge = ridge * jnp.trace(gram) / jnp.maximum(cache["count"], 1) + jnp.finfo(x.dtype).tiny
    gamma = -jnp.linalg.solve(gram + jnp.diag(jnp.where(used, ridge, 1.0)), d @ r)
    jumped = g + gamma @ jnp.where(used[:, None], cache["targets"] - g[None], 0.0)
    return jnp.where(jnp.all(jnp.isfinite(jumped)), jumped, g)


def _where_tree(pred, a, b):
    return jax.tree_util.tree_map(lambda x, y: jnp.where(pred, x, y), a, b)


def _gh_expectation(term: _Term, mean, var, key=None):
    """The term's summed reward at its predictors' marginals: ``sum_n E[l_n]`` by
    Gauss-Hermite, or the objective's (autocvi.analysis.objectives)."""

    def flat_rest(e):
        return jnp.reshape(term.rest(jnp.reshape(e, term.eta_shape)), (-1,))

    return jnp.sum(term.expected(flat_rest, mean, jnp.maximum(var, 0.0) + term.residual, key))


class BlockPosterior(Distribution):
    """q over a large Gaussian site, kept in structured form (no D x D covariance).

    What :meth:`GaussianBlock.posterior` returns for blocks of more than 1,000
    dimensions (``CVI.get_posterior``, ``FitResult.posterior``). Everything is
    exact and computed from the block's solver without forming the D x D
    covariance: ``mean``, ``variance``, ``sample``, ``log_prob``, ``entropy``,
    :meth:`predictive_moments` (mean and variance of ``A @ value`` per row of
    ``A``) and :meth:`sample_with_log_prob` (draws with their log density).
    Costs per value or row: O(N D) with the function-space solver (N sites),
    O(D^2) weight-space, O(T) Markov; a site whose prior is a dense kernel
    (whitened) adds its D x D triangular factor, which the prior already holds.

    Args:
        block: the :class:`GaussianBlock` (``schedule.blocks[name]``).
        sites: its state (``state.natural[name]``).
        mean, var: the site's mean and marginal variance when already known
            (default: computed, :meth:`GaussianBlock.site_moments`).
    """

    arg_constraints = {}
    support = constraints.real_vector
    reparametrized_params = []
    gaussian_marginals = True  # autocvi.analysis.constrained.normal_chain

    def __init__(self, block: GaussianBlock, sites, mean=None, var=None):
        if mean is None or var is None:
            mean, var = block.site_moments(sites)
        self._block, self._sites = block, sites
        self._mean, self._var = mean, var
        self._aux = None
        shape = block.layout.shape
        super().__init__(batch_shape=(), event_shape=shape)

    @property
    def _solved(self):
        """The solver's factors at the sites (computed once)."""
        if self._aux is None:
            self._aux = self._block.solve(self._sites)[1]
        return self._aux

    @property
    def _size(self) -> int:
        return int(np.prod(self._block.layout.shape))

    @property
    def mean(self):
        return self._mean

    @property
    def variance(self):
        return self._var

    def sample(self, key, sample_shape=()):
        n = int(np.prod(sample_shape)) if sample_shape else 1
        x = self._block.method.sample(self._block, self._solved, key, n)
        site = self._block.layout.to_site(x)
        return jnp.reshape(site, tuple(sample_shape) + self._block.layout.shape)

    def _log_q_x(self, x):
        """log q of the site value whose family coordinates are ``x`` (``(..., D)``)."""
        block = self._block
        return block.method.log_density(block, self._solved, x) - block.layout.log_det_whitening

    def log_prob(self, value):
        """The exact log density of q at ``value`` (``(..., *event_shape)``)."""
        value = jnp.asarray(value)
        lead = value.shape[: value.ndim - len(self.event_shape)]
        x = jnp.reshape(value, lead + (self._size,))
        whitening = self._block.layout.whitening
        if whitening is not None:  # site = loc + tril x
            loc, tril = whitening
            flat = jnp.reshape(x - loc, (-1, self._size)).T
            x = jnp.reshape(jax.scipy.linalg.solve_triangular(tril, flat, lower=True).T, x.shape)
        return self._log_q_x(x)

    def sample_with_log_prob(self, key, sample_shape=()):
        """Draws of q and their exact log density: ``(values, log_q)``, shapes
        ``sample_shape + event_shape`` and ``sample_shape``."""
        block = self._block
        sample_shape = tuple(sample_shape)
        n = int(np.prod(sample_shape)) if sample_shape else 1
        x = block.method.sample(block, self._solved, key, n)
        site = jnp.reshape(block.layout.to_site(x), sample_shape + block.layout.shape)
        return site, jnp.reshape(self._log_q_x(x), sample_shape)

    def entropy(self):
        """The exact entropy of q."""
        block = self._block
        half_log_det = 0.5 * block.method.log_det_covariance(block, self._solved)
        n = self._size
        return (
            0.5 * n * (1.0 + jnp.log(2.0 * jnp.pi)) + half_log_det + block.layout.log_det_whitening
        )

    def predictive_moments(self, A):
        """Mean and variance of ``A @ value`` under q, one per row of ``A``.

        ``A``: ``(M, *event_shape)`` (or ``(M, D)`` with ``D`` the site's size; one
        row ``(D,)`` gives scalars). Exact, without the D x D covariance:
        ``Var[a @ value] = a Cov a^T`` through the solver's factors.
        """
        A = jnp.asarray(A)
        single = A.ndim == 1
        rows = jnp.reshape(A, (-1, self._size))
        mean = rows @ jnp.reshape(self._mean, (-1,))
        whitening = self._block.layout.whitening
        rows_x = rows if whitening is None else rows @ whitening[1]  # a tril: acting on x
        block = self._block
        var = block.method.predictive_variance(block, self._solved, rows_x)
        return (mean[0], var[0]) if single else (mean, var)


# --------------------------------------------------------------- detection
def find_block(node, factors, example: dict, params: dict) -> GaussianBlock | None:
    """A :class:`GaussianBlock` for ``node`` (a schedule NodePlan), or None."""
    lay = node.layout
    name = node.name
    if (
        lay.q_family != "MultivariateNormal"
        or lay.transform is not None
        or lay.plate_ndim != 0
        or node.local
    ):
        return None
    exact = [f for f, kind in node.incoming if kind == EXACT.name]
    estimated = [f for f, kind in node.incoming if kind != EXACT.name]
    # The prior is every exact factor (the site's own prior, or the members'
    # priors of a joint group); each must touch this node only.
    # (A joint group's own flat density is no factor at all.)
    if not exact or not estimated or (len(exact) > 1 and lay.whitening is not None):
        return None
    for fname in (*exact, *estimated):
        fplan = factors[fname]
        if fplan.latents != (name,) or fplan.subsampled:
            return None
    dim = lay.family_shape[-1]
    values = {**example, **params}
    predictors = {}
    for fname in estimated:
        lp = factors[fname].linear_predictors.get(name)
        if lp is not None and lp.vector_size is not None:
            return None  # a block's sites are scalar per predictor element
        if lp is None:
            lp = _elementwise_predictor(factors[fname].log_density, values, name, lay)
        if lp is None:
            return None
        predictors[fname] = lp
    dtype = jnp.result_type(float)
    x0 = jnp.zeros((dim,), dtype)

    def at(x):
        return {**values, name: lay.to_site(x)}

    prior_fns = [factors[f].log_density for f in exact]

    def log_prior(x):
        return sum(jnp.sum(fn(at(x))) for fn in prior_fns)

    # The probes and the checks on their results are numpy: jnp on constants outside
    # a compiled program compiles each small op on its own (half a second of a cold plan).
    probe = _probe(dim, dtype)
    rel = _relative_tolerance(dtype)
    colours = np.arange(dim) % 3
    directions = np.stack(
        [probe, np.ones(dim, dtype)] + [(colours == c).astype(dtype) for c in range(3)]
    )

    # Every probe of the prior in one compiled program: evaluated op by op, each
    # primitive of the factors compiles on its own (seconds of a cold plan).
    @structural_jit(runs_once=True)
    def prior_probes(directions):
        grad = jax.grad(log_prior)
        h, hvp = jax.linearize(grad, x0)
        return h, -jax.vmap(hvp)(directions)

    h, products = (np.asarray(x) for x in prior_probes(directions))
    if lay.whitening is not None:
        # The site's own MultivariateNormal prior on the whitened variable:
        # N(0, I) exactly, whatever the conditioning of K (not read numerically,
        # which float32 could not do for an ill-conditioned kernel).
        q_ones, q_probe, h = np.ones(dim, dtype), probe, np.zeros(dim, dtype)
        tol = 1.0
    else:
        q_probe, q_ones = products[0], products[1]
        tol = rel * (1.0 + np.max(np.abs(q_probe)))
    diagonal = bool(np.all(np.abs(q_ones * probe - q_probe) <= tol)) and bool(np.all(q_ones > 0))
    tridiagonal = None
    if not diagonal and dim >= 3:
        idx = np.arange(dim)
        stacked = products[2:]  # (3, D): the precision times each colour's indicator
        q_diag = stacked[idx % 3, idx]
        q_off = np.where(idx > 0, stacked[(idx - 1) % 3, idx], 0.0).astype(dtype)
        q_up = np.concatenate([q_off[1:], np.zeros((1,), dtype)])
        shifted_down = np.concatenate([np.zeros((1,), dtype), probe[:-1]])
        shifted_up = np.concatenate([probe[1:], np.zeros((1,), dtype)])
        recon = q_diag * probe + q_off * shifted_down + q_up * shifted_up
        if bool(np.all(np.abs(recon - q_probe) <= tol)):
            tridiagonal = (jnp.asarray(q_diag), jnp.asarray(q_off))
    h, q_ones = jnp.asarray(h), jnp.asarray(q_ones)
    dense = None
    if not diagonal and tridiagonal is None:
        dense = _dense_prior(log_prior, x0, probe, rel)
        if dense is None:
            return None

    terms = []
    for fname in estimated:
        lp = predictors[fname]

        def eta_flat(x, lp=lp):
            return jnp.reshape(lp.eta_fn(at(x)), (-1,))

        eta_shape = tuple(jax.eval_shape(lambda x, lp=lp: lp.eta_fn(at(x)), x0).shape)
        size = int(np.prod(eta_shape))
        with_jacobian = size * dim <= _MAX_JACOBIAN

        @structural_jit(runs_once=True)
        def predictor_probes(directions, f=eta_flat, with_jacobian=with_jacobian):
            # b, the derivatives along (ones, probe), and (if small enough) the Jacobian
            b, jvp = jax.linearize(f, x0)
            along = jax.vmap(jvp)(directions[1::-1])
            return b, along, jax.jacfwd(f)(x0) if with_jacobian else None

        b, along, A = predictor_probes(directions)

        rest, residual = lp.point_rest(values)
        residual = jnp.ravel(jnp.broadcast_to(residual, eta_shape))

        a = None
        if b.shape[0] == dim:
            a_try, lin = np.asarray(along[0]), np.asarray(along[1])
            if bool(np.all(np.abs(a_try * probe - lin) <= rel * (1 + np.max(np.abs(lin))))):
                a = along[0]
        if A is None and a is None:
            return None
        terms.append(
            _Term(
                fname,
                eta_shape,
                rest,
                A=A,
                a=a,
                b=b,
                residual=residual,
                expected=factors[fname].expected,
                mean_only=factors[fname].reward_reads_mean_only,
                sampled=factors[fname].sampled_gradients,
                predictor=lp,
            )
        )

    num_sites = sum(t.size for t in terms)
    # A reward that is not E[log density] (DLM) has sites of negative precision at its
    # optimum: solve with a solver that takes them.
    signed = any(t.expected is not expected_log_likelihood for t in terms)
    # The Markov solver holds a diagonal or tridiagonal prior precision only: a
    # dense one (a kernel prior that depends on a param, so it is not whitened)
    # must not reach it (its row sums were taken for the diagonal: NaN or a wrong q).
    if len(terms) == 1 and terms[0].a is not None and dense is None:
        q_diag, q_off = tridiagonal if tridiagonal is not None else (q_ones, jnp.zeros_like(q_ones))
        prior = {"q_diag": q_diag, "q_off": q_off, "h": h}
        prior["factored"] = gs.markov_prior(q_diag, q_off, h)
        return GaussianBlock(
            name, "markov", tuple(exact), tuple(terms), lay, dim, prior, signed_sites=signed
        )
    if any(t.A is None for t in terms):
        return None
    # The block's constants in numpy (no op-by-op compiles), handed on as jax arrays.
    A = np.concatenate([np.asarray(t.A) for t in terms])
    b = np.concatenate([np.asarray(t.b) for t in terms])
    if dense is not None:
        m0, L0, Q0 = dense
        prior = {"m0": np.asarray(m0), "L0": np.asarray(L0), "Q0": Q0}
        prior.update(_predictor_prior(prior, A, b, function_space=False))
        prior = {k: jnp.asarray(v) for k, v in prior.items()}
        return GaussianBlock(
            name, "weight-space", tuple(exact), tuple(terms), lay, dim, prior, signed_sites=signed
        )
    if not diagonal:
        return None
    q_ones_np, h_np = np.asarray(q_ones), np.asarray(h)
    sd0 = 1.0 / np.sqrt(q_ones_np)
    m0 = h_np / q_ones_np
    solver = "function-space" if (lay.whitening is not None or num_sites < dim) else "weight-space"
    if signed and dim <= _MAX_DENSE_PRIOR:
        solver = "weight-space"  # it takes signed sites; function-space would clip them
    prior = {"m0": m0, "sd0": sd0}
    prior.update(_predictor_prior(prior, A, b, function_space=solver == "function-space"))
    prior = {k: jnp.asarray(v) for k, v in prior.items()}
    signed = signed and BLOCK_SOLVERS[solver].signed_sites
    return GaussianBlock(
        name, solver, tuple(exact), tuple(terms), lay, dim, prior, signed_sites=signed
    )


def _predictor_prior(prior: dict, A, b, function_space: bool) -> dict:
    """The prior's arrays that involve the predictors ``eta = A x + b`` (numpy or jax
    arrays alike): ``At = A T0`` (``eta - mf`` as a function of the whitened prior
    variable u, ``x = m0 + T0 u``) and ``mf = A m0 + b``, the predictors' prior mean;
    for the function-space solver also ``K = At At^T``, the predictors' prior
    covariance, formed once (every solve needs it)."""
    At = A @ prior["L0"] if "L0" in prior else A * prior["sd0"][None, :]
    out = {"At": At, "mf": A @ prior["m0"] + b}
    if function_space:
        out["K"] = At @ At.T
    return out


def _probe(dim: int, dtype):
    """The random direction the structure checks probe with (a fixed draw)."""
    return np.random.RandomState(11).standard_normal(dim).astype(dtype)


def _relative_tolerance(dtype) -> float:
    """The structure checks' relative tolerance at this precision."""
    return 1e-8 if dtype == jnp.float64 else 1e-4


# Largest dense prior precision (D x D) a block reads with a Hessian.
_MAX_DENSE_PRIOR = 2000


def _dense_prior(log_prior, x0, probe, rel):
    """``(m0, L0, Q0)`` of a Gaussian log prior with a dense precision, or None.

    The precision is the negative Hessian (constant: every prior factor was
    classified as conjugate, i.e. quadratic); it is checked at a second point
    and must be positive definite. ``L0 = R^-T`` with ``Q0 = R R^T``, so
    ``x = m0 + L0 u`` has ``u ~ N(0, I)`` under the prior.
    """
    dim = x0.shape[0]
    if dim > _MAX_DENSE_PRIOR:
        return None

    @structural_jit(runs_once=True)  # one program: op by op, each step would compile on its own
    def moments(x0, probe):
        H0 = jax.hessian(log_prior)(x0)
        Q0 = -0.5 * (H0 + H0.T)
        Q1 = -jax.hessian(log_prior)(x0 + probe)
        R = jnp.linalg.cholesky(Q0)
        m0 = jax.scipy.linalg.cho_solve((R, True), jax.grad(log_prior)(x0))
        L0 = jax.scipy.linalg.solve_triangular(R, jnp.eye(dim, dtype=R.dtype), lower=True).T
        return Q0, Q1, R, m0, L0

    Q0, Q1, R, m0, L0 = moments(x0, jnp.asarray(probe, x0.dtype))
    Q0_np = np.asarray(Q0)
    if not bool(np.all(np.abs(np.asarray(Q1) - Q0_np) <= rel * (1.0 + np.max(np.abs(Q0_np))))):
        return None
    if not bool(np.all(np.isfinite(np.asarray(R)))):
        return None
    return m0, L0, Q0


def _elementwise_predictor(log_density, values, name, lay):
    """The site's own value as the predictor, when output element t reads element t only.

    A factor the jaxpr split cannot see through (e.g. a likelihood on the
    stacked output of a ``scan``) still qualifies when its log density has one
    output per element of the site and its Jacobian w.r.t. the site is
    diagonal; this is checked with random probes at two random points.
    Returns a LinearPredictor with ``eta = site value`` or None.
    """

    shape = lay.shape

    def per_output(z):
        return jnp.reshape(log_density({**values, name: z}), (-1,))

    z0 = jnp.asarray(values[name])
    try:
        out = jax.eval_shape(per_output, z0)
    except Exception:  # noqa: BLE001 - not evaluable on its own: no predictor
        return None
    if out.shape[0] != int(np.prod(shape)):
        return None
    keys = jax.random.split(jax.random.PRNGKey(23), 4)
    for k_point, k_probe in (keys[:2], keys[2:]):
        z = z0 + 0.1 * jax.random.normal(k_point, shape, z0.dtype)
        probe = jax.random.normal(k_probe, shape, z0.dtype)
        diag = jax.jvp(per_output, (z,), (jnp.ones_like(z),))[1]
        lin = jax.jvp(per_output, (z,), (probe,))[1]
        scale = 1e-6 * (1.0 + jnp.max(jnp.abs(lin)))
        if not bool(jnp.all(jnp.abs(diag * jnp.reshape(probe, (-1,)) - lin) <= scale)):
            return None
        if not bool(jnp.all(jnp.isfinite(lin))):
            return None

    def eta_fn(v):
        return jnp.reshape(v[name], (-1,))

    def rest_fn(eta, v):
        return jnp.reshape(log_density({**v, name: jnp.reshape(eta, shape)}), (-1,))

    return LinearPredictor(eta_fn, rest_fn)
