"""Mean-field CVI as an init/step pair over pytrees (CVI paper, Alg. 2).

Every latent node holds natural parameters ``lam_i``. One step visits the
nodes in the schedule's order and sets

    lam_i <- (1 - beta) lam_i + beta * sum_{a in N(i)} g_{a,i},
    g_{a,i} = grad_{mu_i} E_q[log p_a]                    (Khan & Lin 2017, Eq. 10/Alg. 2)

where ``g_{a,i}`` is the exact VMP message for conjugate factors (the gradient
of the exact expected log factor), a Bonnet/Price Monte Carlo estimate for
Gaussian nodes (``E[grad f]``, ``E[hess f]/2``; CVI App. B.1), or a
reparameterised natural-parameter gradient mapped through the inverse Fisher
matrix (CVI App. F). A step that would leave a node's natural-parameter domain
is halved per element until it is valid, so no NaN reaches the state.

``cvi(schedule)`` returns ``CVIAlgorithm(init, step)``; ``step`` is a pure
function meant to be ``jax.jit``-ed once.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ..analysis.expectations import (
    PointSet,
    expect,
    moment_point_set,
    moments_point_set,
    point_mass,
    spherical_radial,
)
from ..analysis.objectives import expected_log_likelihood
from ..families import gaussian_mean_variance, gaussian_moments
from ..model.message_kinds import (
    CUBATURE,
    EXACT,
    FISHER,
    GAUSS_HERMITE,
    MESSAGE_KINDS,
    MONTE_CARLO,
)
from ..plan.schedule import FactorPlan, Schedule
from .init import initial_natural

__all__ = [
    "CVIState",
    "CVIInfo",
    "CVIAlgorithm",
    "cvi",
    "collapsed",
    "expected_log_factor",
    "vmp_message",
]

# fold_in stream of the draws of objectives whose gradients are sampling estimates
_ESTIMATOR_STREAM = 0x51DE


class CVIState(NamedTuple):
    """The whole state of a CVI run.

    ``natural``: natural parameters per latent; ``rng_key``; ``iteration``;
    ``constant_messages``: the exact messages that never change (from factors
    whose only latent is the node itself), computed once by ``init``, keyed
    ``"factor->latent"``. ``elbo_key``: the random numbers of every
    iteration's ELBO estimate (common random numbers across iterations: the
    reported ELBO then changes only as q does, so the stopping rule sees q
    settle instead of the estimate's own scatter); None draws fresh ones.
    """

    natural: dict
    rng_key: jax.Array
    iteration: jax.Array
    constant_messages: dict = {}
    elbo_key: jax.Array | None = None
    # Values of the learned ``numpyro.param`` sites (``Schedule.learned``), on
    # their constrained support: the step reads them here, so an M-step changes
    # them without recompiling anything.
    params: dict = {}
    # Per-element sites of the messages in ``Schedule.site_memory``, keyed
    # ``"factor->latent"``: ``(c1, c2, seen, total)``, the sites ``c1_n eta_n + c2_n eta_n^2``
    # of every plate element (as last computed), which elements were visited, and
    # their message summed over the plate; a memory of gradients (DLM) holds each
    # element's gradients in place of its site, and two more entries: each element's
    # curvature and their sum (_memory_message).
    sites: dict = {}
    # Per subsampled plate, ``(order, cursor)``: a random order of its elements and
    # where the next minibatch starts in it (random reshuffling, see next_batches).
    plate_order: dict = {}
    # Per Gaussian block whose step direction depends on its sites alone, the line
    # search's accepted sites with their ELBO and target (GaussianBlock.update): the
    # next step starts from them when it starts from those sites.
    block_cache: dict = {}
    # Per node, ``(g, c)``: the ELBO terms of its constant-message factors that read no
    # learned param, ``sum_a E_q[log f_a] = <g, mu> + c`` (exact: such a factor is affine
    # in the node's mean parameters; see ``affine_factors`` in :func:`cvi`).
    constant_terms: dict = {}


class CVIInfo(NamedTuple):
    """Per-step diagnostics.

    ``elbo``: the ELBO after the step. ``step_sizes``: per node, the step size
    taken (0 when the line search refused every step: the node kept its
    parameters). ``halvings``: per node, how many times the line search halved
    the step (0 for nodes whose messages are all exact, which need no search).
    ``non_finite``: per node, whether its summed incoming message was not finite (a
    factor's log density or its gradient overflowed at q's draws or nodes); the node
    then kept its parameters and its step is reported as refused (0).
    """

    elbo: jax.Array
    step_sizes: dict = {}
    halvings: dict = {}
    non_finite: dict = {}


class CVIAlgorithm(NamedTuple):
    init: callable
    step: callable
    # ``elbo(state, rng_key) -> value``: the ELBO of q at ``state`` (no update);
    # Monte Carlo terms use ``rng_key``'s draws.
    elbo: callable = None
    # ``move_params(state, values, hold_q=False, sites=None) -> state``: learned params
    # set to ``values`` with q's sites held (the dual M-step's q).
    move_params: callable = None
    # ``held_sites(state)``: the predictor-space sites move_params holds (with their
    # message at the state's params), computed once
    # per M-step and passed to every evaluation of its bound.
    held_sites: callable = None
    # ``elbo_terms(state, rng_key) -> {name: value}``: the ELBO's terms one by one (each
    # factor's expected log density, each block's ELBO, each node's entropy), to name
    # the one that is not finite when the ELBO is not.
    elbo_terms: callable = None


def cvi(schedule: Schedule) -> CVIAlgorithm:
    """Build the ``init``/``step`` pair for a schedule.

    ``init(rng_key) -> CVIState`` and ``step(state) -> (state, CVIInfo)``;
    ``elbo(state, rng_key)``; ``move_params(state, values) -> state`` (the dual
    M-step's q, :func:`move_params` below).
    """
    nodes = schedule.nodes
    layouts = {n: node.layout for n, node in nodes.items()}
    factors = schedule.factors
    num_samples = schedule.num_samples
    params = schedule.params
    graph = schedule.graph
    blocks = schedule.blocks
    block_factors = {f for b in blocks.values() for f in b.factors}
    # (node, factor) pairs whose exact message is constant: the factor's only latent is
    # the node and it sees every element (constant_messages). Those that read no learned
    # param are also affine_factors: their ELBO terms are <g, mu> + c (constant_terms);
    # one that reads a learned param stays a direct evaluation, which the M-step
    # differentiates with respect to the param.
    constant_factors = [
        (i, fname)
        for i, node in nodes.items()
        if i not in blocks
        for fname, kind in node.incoming
        if kind == EXACT.name and factors[fname].latents == (i,) and not factors[fname].subsampled
    ]
    affine_factors = [
        (i, fname)
        for i, fname in constant_factors
        if fname in graph.factors and not set(graph.factors[fname].params) & set(schedule.learned)
    ]
    affine_names = {fname for _, fname in affine_factors}

    def plate_indices(key):
        """A minibatch of every subsampled plate for one ELBO estimate: drawn with
        replacement, O(B). The scaled sum over it is as unbiased as over a draw without
        replacement (whose variance it exceeds by a factor (N - 1) / (N - B), 1.01 at
        B = N / 100), and that draw sorted all N elements (47 ms at N = 10^5 on one
        core): a minibatched SVGP's final ELBO, 64 estimates, took 4.8 s of its 7.8 s
        warm refit. The step walks through random orders instead (next_batches)."""
        idx = {}
        for f in factors.values():
            for p in f.subsampled:
                if p.name not in idx:
                    key, sub = jax.random.split(key)
                    idx[p.name] = jax.random.randint(sub, (p.subsample_size,), 0, p.size)
        return idx

    subsampled_plates = {p.name: p for f in factors.values() for p in f.subsampled}

    def first_orders(key) -> dict:
        return {
            name: (jax.random.permutation(jax.random.fold_in(key, k), p.size), jnp.int32(0))
            for k, (name, p) in enumerate(sorted(subsampled_plates.items()))
        }

    def next_batches(orders: dict, key):
        """The next minibatch of every subsampled plate, and the orders moved past it.

        Random reshuffling: the batches walk through a random order of the plate's
        elements and a new order is drawn once it is used up, so each pass sees every
        element once, a batch never repeats an element (the site memory needs that),
        and a step costs O(B) instead of the O(N log N) of a fresh draw without
        replacement (47 ms a step at N = 10^5 on one core, more than the whole rest
        of an SVGP step).
        """
        indices, moved = {}, {}
        for k, (name, p) in enumerate(sorted(subsampled_plates.items())):
            order, cursor = orders[name]
            indices[name] = order[(cursor + jnp.arange(p.subsample_size)) % p.size]
            cursor = cursor + p.subsample_size
            used_up = cursor + p.subsample_size > p.size
            fresh = jax.random.fold_in(key, k)
            order = jax.lax.cond(
                used_up,
                lambda o, kk, n=p.size: jax.random.permutation(kk, n),
                lambda o, kk: o,
                order,
                fresh,
            )
            moved[name] = (order, jnp.where(used_up, 0, cursor).astype(jnp.int32))
        return indices, moved

    def point_sets(fplan: FactorPlan, lam, mus, key, skip=None):
        """Moment nodes for conjugate neighbours, draws for the others."""
        tensor, drawn = {}, {}
        for j in fplan.latents:
            if j == skip:
                continue
            lay = layouts[j]
            if fplan.conjugate[j]:
                tensor[j] = conjugate_point_set(lay, mus[j], fplan.alignments[j], lam.get(j))
            else:
                key, sub = jax.random.split(key)
                drawn[j] = draws(lay, lam[j], mus[j], sub)
        return tensor, drawn

    def draws(lay, lam_j, mu_j, key):
        """``num_samples`` draws of a node's q; antithetic pairs ``m +- d`` for Gaussians.

        Antithetic pairs cancel every odd term of a factor's Taylor expansion about
        the mean: the Bonnet/Price gradient of a factor quadratic in the node (a
        Gaussian likelihood's weights) is then exact instead of carrying the noise
        ``H (mean(x) - m)``, which on a collinear regression (N = 2,000) kept q's
        means 0.1 sd from the optimum; the estimates stay unbiased for any factor.
        """
        if lay.q_family not in ("Normal", "MultivariateNormal") or num_samples % 2:
            return lay.fam.sample(key, lam_j, (num_samples,))
        half = lay.fam.sample(key, lam_j, (num_samples // 2,))
        return jnp.concatenate([half, 2.0 * mu_j[0][None] - half])

    def expectation(fplan, tensor, drawn, fixed, s, extra=None):
        sets = dict(tensor)
        for j, x in drawn.items():
            sets[j] = point_mass(layouts[j], x[s], fplan.alignments[j])
        if extra is not None:
            sets.update(extra)
        return expect(fplan.log_density, sets, fixed)

    # ------------------------------------------------------------- messages
    def exact_message(fplan, i, lam, mus, key, fixed):
        if all(fplan.conjugate.values()):  # every neighbour at its moment nodes: VMP
            return vmp_message(fplan, layouts, i, mus, fixed, natural=lam)
        tensor, drawn = point_sets(fplan, lam, mus, key, skip=i)

        def expected(point_set):
            extra = {i: point_set}
            if not drawn:
                return expectation(fplan, tensor, drawn, fixed, 0, extra)
            return jnp.mean(
                jax.vmap(lambda s: expectation(fplan, tensor, drawn, fixed, s, extra))(
                    jnp.arange(num_samples)
                )
            )

        return mean_parameter_gradient(
            layouts[i], expected, mus[i], fplan.alignments[i], lam.get(i)
        )

    def gaussian_message(fplan, i, lam, mus, key, fixed):
        """Bonnet/Price: (E[grad f] - E[H] m, E[H]/2) for Normal / MVN nodes, with
        ``E[H]`` by :func:`_expected_hessian` (right for kinked log densities too)."""
        key, sub = jax.random.split(key)
        tensor, drawn = point_sets(fplan, lam, mus, key, skip=i)
        lay = layouts[i]
        xs = draws(lay, lam[i], mus[i], sub)
        align = fplan.alignments[i]
        separable = all(a is not None for a in align.axes)

        def per_sample(s):
            def f(x):
                return expectation(fplan, tensor, drawn, fixed, s, {i: point_mass(lay, x, align)})

            x = xs[s]
            g = jax.grad(f)(x)
            h = _hessian(f, x, lay, separable)
            return g, h

        gs_, hs = jax.vmap(per_sample)(jnp.arange(num_samples))
        m = mus[i][0]
        g = jnp.mean(gs_, 0)
        h = _expected_hessian(lay, xs, m, -2.0 * lam[i][1], gs_, hs)
        if lay.q_family == "MultivariateNormal":
            return (g - jnp.einsum("...ij,...j->...i", h, m), 0.5 * h)
        return (g - h * m, 0.5 * h)

    def fisher_message(fplan, i, lam, mus, key, fixed):
        """Reparameterised grad w.r.t. lam, times the inverse Fisher (CVI App. F)."""
        key, sub = jax.random.split(key)
        tensor, drawn = point_sets(fplan, lam, mus, key, skip=i)
        lay = layouts[i]
        align = fplan.alignments[i]

        def expected(lam_i):
            xs = lay.fam.sample(sub, lam_i, (num_samples,))
            return jnp.mean(
                jax.vmap(
                    lambda s: expectation(
                        fplan, tensor, drawn, fixed, s, {i: point_mass(lay, xs[s], align)}
                    )
                )(jnp.arange(num_samples))
            )

        g_lam = jax.grad(expected)(lam[i])
        return _fisher_solve(lay.fam, lam[i], g_lam)

    def gh_expected_fn(fplan, i, moments, key=None):
        """Per-point log density with node i integrated out by Gauss-Hermite.

        The factor sees node i only through eta = A z + b (one scalar per
        element), so E_q[f] = sum_n E_{N(eta_n | A m + b, a_n^T S a_n)}[l_n(eta_n)]
        (Khan & Lin 2017, App. B.1: dE/dm = E[l'], dE/dv = E[l'']/2 follow by
        differentiating this w.r.t. the mean parameters).
        """
        lay = layouts[i]
        lp = fplan.linear_predictors[i]
        m, cov = moments

        def per_point(values):
            def eta_of(x):  # x in the family layout (affine map to the site)
                return lp.eta_fn({**values, i: lay.to_site(x)})

            mean = eta_of(m)
            jac = jax.jacfwd(eta_of)(m).reshape(mean.size, *lay.family_shape)
            if lay.q_family == "MultivariateNormal":
                # diag(A S A^T), block-diagonal S over plate elements
                var = jnp.einsum("n...d,...de,n...e->n", jac, cov, jac)
            else:
                var = jnp.einsum("n...,...,n...->n", jac, cov, jac)
            rest, residual = lp.point_rest(values)
            var = jnp.reshape(jnp.maximum(var, 0.0), mean.shape) + residual
            # E[l] by Gauss-Hermite, or the objective's reward (autocvi.analysis.objectives)
            return fplan.expected(rest, mean, var, key)

        return per_point

    def cubature_expected_fn(fplan, i, moments, key=None):
        """Per-point log density with node i integrated out by K-dim cubature.

        The factor sees node i only through a K-vector predictor per element,
        ``eta_n = A_n z + b_n``, so E_q[f] = sum_n E_{N(eta_n | m_n, V_n)}[l_n(eta_n)]. Its
        value is the spherical-radial rule's; its gradient w.r.t. (m_n, V_n) is the
        rule's E[grad l_n], E[hess l_n]/2 (Bonnet/Price, :func:`_cubature_surrogate`),
        which the chain rule through the predictor turns into the natural-gradient
        message with K x K blocks (Khan & Lin 2017, App. B.1).
        """
        lay = layouts[i]
        lp = fplan.linear_predictors[i]
        m, cov = moments

        def per_point(values):
            return _cubature_surrogate(lp, lay, i, m, cov, values)

        return per_point

    # The expectation of a factor over a linear predictor, per message kind.
    predictor_expected = {
        GAUSS_HERMITE.name: gh_expected_fn,
        CUBATURE.name: cubature_expected_fn,
    }
    edge_kinds = {(f, n): k for n, node in nodes.items() for f, k in node.incoming}

    def gh_expectation(fplan, i, moments, tensor, drawn, fixed, key=None):
        """``E_q[log f]`` with node i integrated over its linear predictor; ``moments``:
        q_i's ``(mean, covariance)`` (or variance), read from its natural parameters
        (:func:`autocvi.families.gaussian_moments`)."""
        expected_fn = predictor_expected.get(edge_kinds.get((fplan.name, i)), gh_expected_fn)
        per_point = expected_fn(fplan, i, moments, key)

        def at(s):
            sets = dict(tensor)
            for j, x in drawn.items():
                sets[j] = point_mass(layouts[j], x[s], fplan.alignments[j])
            return expect(per_point, sets, fixed)

        if not drawn:
            return at(0)
        return jnp.mean(jax.vmap(at)(jnp.arange(num_samples)))

    def gauss_hermite_message(fplan, i, lam, mus, key, fixed):
        tensor, drawn = point_sets(fplan, lam, mus, key, skip=i)
        # ``sub``: the draws of an objective whose gradient is a sampling estimate (folded
        # in, so that the other draws of the step stay what they were without one)
        sub = jax.random.fold_in(key, _ESTIMATOR_STREAM)
        # The gradient in the mean parameters (m, S + m m^T) by the chain rule from the one
        # in (m, S): S read from the natural parameters. As E[x x^T] - m m^T it cancels in
        # float32 for a q narrow against its mean (a Poisson GLM's intercept 8.8 +- 6e-4:
        # the predictor's variance came out negative, was clipped to 0, the message lost its
        # precision and q stopped 770 sd off, saying converged).
        m, cov = gaussian_moments(lam[i], layouts[i].q_family)
        gm, gs = jax.grad(
            lambda m_, s_: gh_expectation(fplan, i, (m_, s_), tensor, drawn, fixed, sub),
            argnums=(0, 1),
        )(m, cov)
        if layouts[i].q_family == "MultivariateNormal":
            gs = 0.5 * (gs + jnp.swapaxes(gs, -1, -2))
            return (gm - 2.0 * jnp.einsum("...ij,...j->...i", gs, m), gs)
        return (gm - 2.0 * gs * m, gs)

    def constant_messages(values=None):
        """Exact messages from factors whose only latent is the node itself.

        Such a factor is affine in the node's statistics with constant
        coefficients, so its VMP message does not change between iterations
        (e.g. a prior with fixed hyperparameters): compute it once, and again
        only when the params it reads change (``values``: learned param values).
        """
        fixed = {**params, **(values or {})}
        ref_key = jax.random.PRNGKey(0)  # where they are computed: any point of q's family
        out = {}
        for i, fname in constant_factors:
            lay = layouts[i]
            lam_ref = lay.reference_natural(ref_key)
            mu_ref = lay.fam.natural_to_mean(lam_ref)
            g = exact_message(factors[fname], i, {}, {i: mu_ref}, ref_key, fixed)
            if _is_gaussian(lay) and _rounding_matters():
                lam_at, ok = _near_the_factor(lay, g, lam_ref)
                mu_at = lay.fam.natural_to_mean(lam_at)
                again = exact_message(factors[fname], i, {i: lam_at}, {i: mu_at}, ref_key, fixed)
                g = jax.tree_util.tree_map(lambda a, b, ok=ok: _where(ok, a, b), again, g)
            out[f"{fname}->{i}"] = g
        return out

    def constant_terms(messages, values=None) -> dict:
        """Per node, ``(g, c)`` with ``sum_a E_q[log f_a] = <g, mu> + c`` over its
        ``affine_factors``: ``g`` their summed messages, ``c`` fixed by one evaluation of
        each term at the reference point. The ELBO then evaluates none of these factors
        (a model with J scalar sites under fixed priors no longer puts J prior densities
        into every compiled ELBO: at J = 24, 7,380 -> 4,423 equations in the step)."""
        fixed = {**params, **(values or {})}
        ref_key = jax.random.PRNGKey(0)
        out = {}
        for i, fname in affine_factors:
            lay = layouts[i]
            lam_ref = lay.reference_natural(ref_key)
            mu_ref = lay.fam.natural_to_mean(lam_ref)
            g = messages[f"{fname}->{i}"]
            value = factor_term(factors[fname], {i: lam_ref}, {i: mu_ref}, ref_key, fixed)
            c = value - _pairing(g, mu_ref)
            if i in out:
                g_sum, c_sum = out[i]
                g, c = jax.tree_util.tree_map(jnp.add, g_sum, g), c_sum + c
            out[i] = (g, c)
        return out

    # How each registered message kind is computed (autocvi.model.message_kinds).
    message_fns = {
        GAUSS_HERMITE.name: gauss_hermite_message,
        # the same gradient of the predictor's expectation; gh_expectation picks the rule
        CUBATURE.name: gauss_hermite_message,
        EXACT.name: exact_message,
        MONTE_CARLO.name: gaussian_message,
        FISHER.name: fisher_message,
    }
    missing = set(MESSAGE_KINDS) - set(message_fns)
    if missing:
        raise NotImplementedError(f"the engine does not compute message kinds {sorted(missing)}")

    # ----------------------------------------------------------------- ELBO
    def factor_term(fplan, lam, mus, key, fixed):
        """``E_q[log f]`` of one factor (by the predictor's quadrature where it has one)."""
        gh = next(iter(fplan.linear_predictors), None)
        if gh is not None:
            tensor, drawn = point_sets(fplan, lam, mus, key, skip=gh)
            return gh_expectation(
                fplan, gh, gaussian_moments(lam[gh], layouts[gh].q_family), tensor, drawn, fixed
            )
        tensor, drawn = point_sets(fplan, lam, mus, key)
        if not drawn:
            return expectation(fplan, tensor, drawn, fixed, 0)
        return jnp.mean(
            jax.vmap(lambda s: expectation(fplan, tensor, drawn, fixed, s))(jnp.arange(num_samples))
        )

    def elbo_parts(lam, key, fixed, terms, block_elbos=None, only=None) -> list:
        """The ELBO's terms at ``lam`` in the order :func:`elbo` adds them, as ``(name,
        value)``: each block's ELBO, each factor's expected log density, each node's
        constant-term pairing and entropy (arguments as :func:`elbo`)."""
        mus = {j: layouts[j].fam.natural_to_mean(lam[j]) for j in lam if j not in blocks}
        parts = []
        if only is None:
            # A block's factors touch no other latent: its term is the one its update returned.
            block_elbos = block_elbos or {j: block.elbo(lam[j]) for j, block in blocks.items()}
            parts += list(block_elbos.items())
        for fplan in factors.values():
            if fplan.name in block_factors or (only is not None and only not in fplan.latents):
                continue
            # split for every factor, as before the affine terms: the others keep their
            # random numbers (the same fits, draw for draw)
            key, sub = jax.random.split(key)
            if fplan.name in affine_names:
                continue  # in ``terms`` (constant_terms)
            parts.append((fplan.name, factor_term(fplan, lam, mus, sub, fixed)))
        for j in lam:
            if j in blocks or (only is not None and j != only):
                continue
            if j in terms:
                g, c = terms[j]
                parts += [(f"affine factors of {j}", _pairing(g, mus[j])), (f"constant of {j}", c)]
            entropy = jnp.sum(layouts[j].fam.entropy(lam[j]))
            for _, plate in nodes[j].subsample_axes:
                entropy = entropy * (plate.size / plate.subsample_size)
            parts.append((f"entropy of {j}", entropy))
        return parts

    def elbo(lam, key, fixed, terms, block_elbos=None, only=None):
        """The ELBO at ``lam``; with ``only`` (a node), just the terms that change
        with that node (its factors and its entropy), for the step's line search.
        ``terms``: the state's ``constant_terms``, which stand for ``affine_factors``."""
        if only is None:
            block_elbos = block_elbos or {j: block.elbo(lam[j]) for j, block in blocks.items()}
        parts = elbo_parts(lam, key, fixed, terms, block_elbos, only)
        first = len(block_elbos) if only is None else 0  # the blocks' terms come first
        total = sum(v for _, v in parts[:first]) if only is None else 0.0
        for _, value in parts[first:]:
            total = total + value
        if only is not None:
            return total
        # Factors without latent neighbours (observed-only terms) are constants,
        # and so is the log-Jacobian of whitened Gaussian nodes.
        whitening = sum(lay.log_det_whitening for j, lay in layouts.items() if j not in blocks)
        return total + whitening + _constant_terms(graph, params, fixed)

    # Whole-site Gaussian nodes without a line search (minibatched) that receive log-loss
    # DLM rewards: their step is Newton's on q's mean (_newton_mean_update), with the
    # factors whose curvature it needs (a site memory of gradients keeps it per element).
    newton_nodes = {
        i: tuple(f for f, kind in node.incoming if _is_log_loss(factors[f], i))
        for i, node in nodes.items()
        if i not in blocks
        and not node.local
        and any(factors[f].subsampled for f, _ in node.incoming)
        and node.layout.q_family == "MultivariateNormal"
        and node.layout.plate_ndim == 0
    }
    newton_nodes = {i: fs for i, fs in newton_nodes.items() if fs}

    # Nodes with estimated messages: their steps are safeguarded by the ELBO. Minibatched
    # ones too, on the step's batch (N/B-scaled, an unbiased estimate of the ELBO): the
    # CVI step is natural-gradient ascent on that batch's objective, so the search only
    # bites on a step that overshoots, and without it one such step (a minibatched linear
    # regression with a half-normal scale, N = 2,000, B = 100: a Monte Carlo message at
    # the third iteration) threw q 750 sd away and collapsed its variances. Not the nodes
    # whose messages come from site memory (a SAG estimate of the full-data message is
    # not an ascent direction of one batch's objective; its step is held constant) and not
    # the Newton nodes above.
    safeguarded = {
        i
        for i, node in nodes.items()
        if i not in blocks
        and i not in newton_nodes
        and not node.local
        and not schedule.memory_of(i)
        and any(kind != EXACT.name for _, kind in node.incoming)
    }
    # Site-memory nodes are searched on their batch during the memory's first pass: until
    # every element has a site, the estimate is the N/(elements seen)-scaled sum of the
    # sites seen (the first batch's is exactly the minibatch message), and the first steps
    # are the ones taken far from the data. Unsearched, a Poisson GLM whose intercept
    # prior sat 4 below the counts' scale (N = 2,000, B = 100) took a first Newton-like
    # step to b0 = 74 and collapsed its variances. Once the memory is full the step is held
    # (a SAG estimate is not an ascent direction of one batch's objective).
    searched_first_pass = {
        i: tuple(f"{fname}->{i}" for fname in schedule.memory_of(i))
        for i, node in nodes.items()
        if i not in blocks and i not in newton_nodes and not node.local and schedule.memory_of(i)
    }

    def safeguarded_update(i, lam, message, beta, key, fixed, terms, max_halvings=_MAX_HALVINGS):
        """The damped step, halved while it lowers the node's ELBO terms: ``(lam_i, b, k)``.

        The ELBO terms that change with node i are estimated before and after
        with the same random numbers (common random numbers), so the comparison
        is not swamped by Monte Carlo noise; a step that is not finite or lowers
        them by more than rounding is halved up to ``max_halvings`` times and
        refused (the node keeps its parameters, ``b = 0``) if none helps; ``k``
        counts the halvings. This is a
        backtracking line search on the CVI step (DESIGN.md section 2: every
        update is safeguarded), which the Gaussian blocks also do.
        """
        fam = layouts[i].fam
        old = lam[i]

        def bad(v, before):
            slack = _LINE_SEARCH_SLACK * (1.0 + jnp.abs(before))
            return ~jnp.isfinite(v) | (v < before - slack)

        # One loop evaluates the start (k = -2), the full step (k = -1) and each halving:
        # the node's ELBO terms appear once in the compiled step, not once per call site
        # (eight schools' step: 3,243 -> 2,224 equations, its compilation ~10% shorter).
        def attempt(carry):
            b, k, _, before = carry
            b = jnp.where(k < 0, b, 0.5 * b)
            cand = damped_update(fam, old, message, b)
            start = k == -2
            cand = jax.tree_util.tree_map(lambda o, c: jnp.where(start, o, c), old, cand)
            v = elbo({**lam, i: cand}, key, fixed, terms, only=i)
            # A q whose variance is below rounding is not a q this precision can hold
            # (its ELBO terms are then cancellation): refused like a non-finite one.
            if layouts[i].q_family in ("Normal", "MultivariateNormal"):
                v = jnp.where(collapsed(cand, layouts[i].q_family) & ~start, -jnp.inf, v)
            return b, k + 1, v, jnp.where(start, v, before)

        b0 = jnp.asarray(beta, jnp.result_type(float))
        nan = jnp.asarray(jnp.nan, jnp.result_type(float))
        b, k, v, before = jax.lax.while_loop(
            lambda c: (c[1] < 0) | ((c[1] < max_halvings) & bad(c[2], c[3])),
            attempt,
            (b0, jnp.asarray(-2, jnp.int32), nan, nan),
        )
        # A message that is not finite moves nothing (damped_update keeps such elements),
        # and its candidate ties with the start: without this the step would be recorded
        # as taken and a node stuck on NaN gradients would look settled (a minibatched
        # negative-binomial GLM in float32 whose predictor overflowed exp at its draws
        # stopped 47 sd from the posterior saying converged).
        ok = (
            ~bad(v, before)
            | ~jnp.isfinite(before)
            | (jnp.isfinite(v) & settled(i, old, message, b0))
        )
        ok = ok & _all_finite(message)
        cand = damped_update(fam, old, message, b)
        new = jax.tree_util.tree_map(lambda n, o: jnp.where(ok, n, o), cand, old)
        return new, jnp.where(ok, b, 0.0), k

    def settled(i, old, message, beta):
        """Whether node i's full step would move its Gaussian q by less than
        ``_SETTLED_MOVE`` of an sd in every mean and ``_SETTLED_VARIANCE`` in every
        variance: a step the line search refuses there is a tie at the optimum (the
        message's Monte Carlo noise and the ELBO's rounding), and the smallest step
        tried is taken instead of none. Without it a float32 Poisson GLM with group
        intercepts at counts near 8,000 refused ten such steps in a row at its optimum
        (moves of 0.01-0.08 sd, ELBO drops of 0.02-0.17 nats against ~1e8 in its sums)
        and ended "stuck", not converged. A step refused far from the optimum moves q
        by more and is still refused (and a node refused throughout is still stuck).
        Other families: never (their refusals are reported as they are)."""
        q_family = layouts[i].q_family
        if q_family not in ("Normal", "MultivariateNormal"):
            return jnp.zeros((), bool)
        # the plain step (not damped_update's repairs: a step that needs one is no tie;
        # a precision it leaves indefinite gives NaN moments, which compare False)
        full = jax.tree_util.tree_map(lambda o, g: (1.0 - beta) * o + beta * g, old, message)
        m0, v0 = gaussian_mean_variance(old, q_family)
        m1, v1 = gaussian_mean_variance(full, q_family)
        move = jnp.max(jnp.abs(m1 - m0) / jnp.sqrt(v0))
        spread = jnp.max(jnp.abs(v1 / v0 - 1.0))
        return (move < _SETTLED_MOVE) & (spread < _SETTLED_VARIANCE)

    def held_update(i, lam_i, message, beta):
        """The damped step at the schedule's size, unsearched: ``(lam_i, b, k)``.

        A message that is not finite leaves the node where it was: the step is reported
        as refused, so a node that stops moving for that reason is "stuck" (not
        converged) instead of looking settled."""
        new = damped_update(layouts[i].fam, lam_i, message, beta)
        b = jnp.where(_all_finite(message), jnp.asarray(beta, jnp.result_type(float)), 0.0)
        return new, b, jnp.zeros((), jnp.int32)

    # ----------------------------------------------------------- init/step
    # Gauss-Hermite messages to a whole-site Gaussian from a factor that reads learned
    # params and no other latent: the dual M-step holds their sites in predictor space
    # (t-SVGP's sites on f), not the message to the node (see move_params).
    predictor_sites = [
        (i, fname)
        for i, node in nodes.items()
        if i not in blocks
        and node.layout.q_family == "MultivariateNormal"
        and node.layout.plate_ndim == 0
        for fname, kind in node.incoming
        if kind == GAUSS_HERMITE.name
        and factors[fname].latents == (i,)
        and not factors[fname].subsampled
        and i in factors[fname].linear_predictors
        and fname in graph.factors
        and set(graph.factors[fname].params) & set(schedule.learned)
    ]

    def init(rng_key) -> CVIState:
        natural = initial_natural(schedule, rng_key)
        elbo_key = jax.random.fold_in(rng_key, 1)
        # Strongly typed floats: a weakly typed initial value (a Python float) would
        # give the state another type than the M-step's output, and every compiled
        # program would be traced again after the first M-step.
        learned = {
            n: jnp.asarray(params[n], dtype=jnp.result_type(float)) for n in schedule.learned
        }
        messages = constant_messages(learned)
        return CVIState(
            natural,
            rng_key,
            jnp.zeros((), jnp.int32),
            messages,
            elbo_key,
            learned,
            empty_site_memory(natural),
            first_orders(jax.random.fold_in(rng_key, 2)),
            empty_block_cache(natural),
            constant_terms(messages, learned),
        )

    def empty_block_cache(natural) -> dict:
        return {n: block.empty_cache(natural[n]) for n, block in blocks.items() if block.cacheable}

    def empty_site_memory(natural) -> dict:
        """No site seen yet: the first visit of an element adds its whole site."""
        out = {}
        for mem in schedule.site_memory:
            # scalar sites: (N,) and (N,); a K-vector predictor's: (N, K) and (N, K, K)
            ev = tuple(mem.event_shape)
            c1 = jnp.zeros((mem.plate.size, *ev), jnp.result_type(float))
            c2 = jnp.zeros((mem.plate.size, *ev, *ev), jnp.result_type(float))
            seen = jnp.zeros((mem.plate.size,), bool)
            total = jax.tree_util.tree_map(jnp.zeros_like, natural[mem.node])
            out[f"{mem.factor}->{mem.node}"] = (c1, c2, seen, total)
            if mem.gradients:  # and each element's curvature, and their sum
                curvature = jnp.zeros_like(total[1])
                out[f"{mem.factor}->{mem.node}"] += (jnp.zeros_like(c1), curvature)
        return out

    def held_sites(state: CVIState) -> dict:
        """The sites of every predictor-site message at ``state`` and their message at
        its params, ``(sites, message)`` (see move_params)."""
        fixed = {**params, **state.params}
        held = {}
        for node, fname in predictor_sites:
            lam = state.natural[node]
            sites = _predictor_sites(factors[fname], layouts[node], node, lam, fixed)
            message = _site_message(factors[fname], layouts[node], node, lam, sites, fixed)
            held[(node, fname)] = (sites, message)
        return held

    def move_params(
        state: CVIState, values: dict, hold_q: bool = False, sites: dict | None = None
    ) -> CVIState:
        """q with the learned params set to ``values``, its sites held (t-SVGP Eq. 15).

        Adam, Chang, Khan & Solin, *Dual Parameterization of Sparse Variational
        Gaussian Processes* (NeurIPS 2021), Eq. 15: the M-step keeps the sites
        lambda_t* the E-step found and lets the prior's natural parameter move,
        eta(theta) = eta_0(theta) + lambda_t*. Here every message that is a
        closed-form function of the params alone (the constant messages: a
        prior, or a conjugate likelihood whose only latent is the node) moves
        with them, and the rest of each node's natural parameter (what the
        E-step estimated) is held: lam_i(theta) = lam_i - sum_a m_a(theta_t) +
        sum_a m_a(theta). A Gauss-Hermite message to a whole-site Gaussian from a
        factor that reads the params (a GP classification likelihood through
        ``f = A(theta) u``) is held as t-SVGP holds it: as sites on the predictor,
        one Gaussian factor ``exp(c1_n eta_n + c2_n eta_n^2)`` per element
        (their Eqs. 9, 15), mapped to the node through the predictor at the new
        params. Any q gives a lower bound, so the ELBO at this q is
        a valid M-step objective; for Gaussian-likelihood GP regression it is
        the exact log marginal likelihood at every theta (t-SVGP, below Eq. 17).
        ``hold_q=True`` keeps q itself (their Eq. 14, the standard M-step) and
        only updates the params and the cached messages. ``sites``: ``held_sites(state)``
        when the caller evaluates many params at one state (the M-step's line search).
        """
        values = {**state.params, **values}
        new = constant_messages(values)
        if hold_q:
            return state._replace(constant_messages=new, params=values)
        natural = dict(state.natural)
        for key, message in new.items():
            node = key.split("->", 1)[1]
            delta = jax.tree_util.tree_map(jnp.subtract, message, state.constant_messages[key])
            natural[node] = jax.tree_util.tree_map(jnp.add, natural[node], delta)
        new_fixed = {**params, **values}
        sites = held_sites(state) if sites is None else sites
        for node, fname in predictor_sites:
            # the message at the state's params is held with the sites: an M-step
            # evaluating many params at one state computes it once
            held, before = sites[(node, fname)]
            lam_i = state.natural[node]
            after = _site_message(factors[fname], layouts[node], node, lam_i, held, new_fixed)
            delta = jax.tree_util.tree_map(jnp.subtract, after, before)
            natural[node] = jax.tree_util.tree_map(jnp.add, natural[node], delta)
        return state._replace(natural=natural, constant_messages=new, params=values)

    def step(state: CVIState):
        key, plate_key, elbo_key, sweep_key = jax.random.split(state.rng_key, 4)
        indices, orders = next_batches(state.plate_order, plate_key)
        fixed = {**params, **state.params, **indices}
        # Local nodes of subsampled plates: work on the sampled elements only.
        lam = {n: _gather(nodes[n], lam_n, indices) for n, lam_n in state.natural.items()}
        block_elbos = {}
        step_sizes, halvings, non_finite = {}, {}, {}
        sites = dict(state.sites)
        block_cache = dict(state.block_cache)
        for i in schedule.order:
            node = nodes[i]
            if i in blocks:
                beta = schedule.block_step_size
                sub = jax.random.fold_in(sweep_key, _ESTIMATOR_STREAM + len(block_elbos))
                lam[i], block_elbos[i], taken, cache = blocks[i].update(
                    lam[i], beta, sub, block_cache.get(i)
                )
                if cache is not None:
                    block_cache[i] = cache
                # The step taken is recorded where the gradients are sampled (a refused
                # sampled step is not an ascent direction: the run's diagnostics say so);
                # a deterministic block's refusals happen at its optimum (ties in rounding).
                step_sizes[i], halvings[i] = (
                    taken
                    if schedule.objective.sampled_gradients
                    else jnp.asarray(beta, jnp.result_type(float)),
                    jnp.zeros((), jnp.int32),
                )
                continue
            mus = {j: layouts[j].fam.natural_to_mean(lam[j]) for j in lam if j not in blocks}
            total = None
            memory = schedule.memory_of(i)
            # with log-loss rewards (newton_nodes): the objective's curvature in q's mean
            curvature = 0.0
            for fname, kind in node.incoming:
                sweep_key, sub = jax.random.split(sweep_key)
                if f"{fname}->{i}" in state.constant_messages:
                    g = state.constant_messages[f"{fname}->{i}"]
                elif fname in memory:
                    key_ = f"{fname}->{i}"
                    g, sites[key_] = _MEMORY_MESSAGES[memory[fname].kind](
                        factors[fname], layouts[i], i, lam[i], sites[key_], memory[fname], fixed
                    )
                else:
                    g = message_fns[kind](factors[fname], i, lam, mus, sub, fixed)
                    # Factors in a subsampled plate are scaled by N/B for the global
                    # nodes (an unbiased estimate, CVI Eq. 14); a local node's own
                    # elements must see them unscaled.
                    scale = _local_message_scale(node, factors[fname])
                    if scale != 1.0:
                        g = jax.tree_util.tree_map(lambda a, c=scale: a * c, g)
                total = g if total is None else jax.tree_util.tree_map(jnp.add, total, g)
                if i in newton_nodes:
                    if fname in memory:
                        k = _memory_curvature(sites[f"{fname}->{i}"], memory[fname])
                    elif fname in newton_nodes[i]:
                        A, k = _log_loss_curvature(factors[fname], layouts[i], i, lam[i], fixed)
                        k = jnp.einsum("nd,n,ne->de", A, k, A)
                    else:
                        k = -2.0 * g[1]
                    curvature = curvature + k
            beta = schedule.step_size_at(state.iteration, local=node.local, node=i)
            non_finite[i] = ~_all_finite(total)
            if i in newton_nodes:
                lam[i], finite = _newton_mean_update(layouts[i].fam, lam[i], total, curvature, beta)
                step_sizes[i], halvings[i] = (
                    jnp.where(finite, jnp.asarray(beta, jnp.result_type(float)), 0.0),
                    jnp.zeros((), jnp.int32),
                )
            elif i in safeguarded:
                lam[i], step_sizes[i], halvings[i] = safeguarded_update(
                    i,
                    lam,
                    total,
                    beta,
                    sweep_key,
                    fixed,
                    state.constant_terms,
                    jnp.where(
                        state.iteration < _START_ITERATIONS, _FIRST_PASS_HALVINGS, _MAX_HALVINGS
                    ),
                )
            elif i in searched_first_pass:
                filling = ~jnp.all(
                    jnp.stack([jnp.all(state.sites[k][2]) for k in searched_first_pass[i]])
                )
                lam[i], step_sizes[i], halvings[i] = jax.lax.cond(
                    filling,
                    lambda lam=lam, i=i, total=total, beta=beta, key=sweep_key: safeguarded_update(
                        i, lam, total, beta, key, fixed, state.constant_terms, _FIRST_PASS_HALVINGS
                    ),
                    lambda lam=lam, i=i, total=total, beta=beta: held_update(
                        i, lam[i], total, beta
                    ),
                )
            else:
                lam[i], step_sizes[i], halvings[i] = held_update(i, lam[i], total, beta)
        natural = {n: _scatter(nodes[n], state.natural[n], lam[n], indices) for n in state.natural}
        if state.elbo_key is None:
            value = elbo(lam, elbo_key, fixed, state.constant_terms, block_elbos)
        elif not subsampled_plates:
            value = elbo(lam, state.elbo_key, fixed, state.constant_terms, block_elbos)
        else:
            # Common random numbers for the minibatch too: the reported ELBO is
            # estimated on one fixed batch (drawn with replacement, O(B)), so it
            # changes only as q does. On the step's own batch its scatter (40 nats
            # a step for an SVGP on 600 points, B = 60) hid that q had settled and
            # the stopping rule never fired.
            held = {
                name: jax.random.randint(
                    jax.random.fold_in(state.elbo_key, k), (p.subsample_size,), 0, p.size
                )
                for k, (name, p) in enumerate(sorted(subsampled_plates.items()))
            }
            at = {n: _gather(nodes[n], lam_n, held) for n, lam_n in natural.items()}
            value = elbo(
                at, state.elbo_key, {**params, **state.params, **held}, state.constant_terms
            )
        new_state = state._replace(
            natural=natural,
            rng_key=key,
            iteration=state.iteration + 1,
            sites=sites,
            plate_order=orders,
            block_cache=block_cache,
        )
        return new_state, CVIInfo(value, step_sizes, halvings, non_finite)

    def elbo_at(state: CVIState, rng_key):
        plate_key, elbo_key = jax.random.split(rng_key)
        indices = plate_indices(plate_key)
        fixed = {**params, **state.params, **indices}
        lam = {n: _gather(nodes[n], lam_n, indices) for n, lam_n in state.natural.items()}
        return elbo(lam, elbo_key, fixed, state.constant_terms)

    def elbo_terms(state: CVIState, rng_key) -> dict:
        plate_key, elbo_key = jax.random.split(rng_key)
        indices = plate_indices(plate_key)
        fixed = {**params, **state.params, **indices}
        lam = {n: _gather(nodes[n], lam_n, indices) for n, lam_n in state.natural.items()}
        return dict(elbo_parts(lam, elbo_key, fixed, state.constant_terms))

    return CVIAlgorithm(init, step, elbo_at, move_params, held_sites, elbo_terms)


def _predictor_moments(fplan: FactorPlan, lay, node: str, lam, fixed):
    """``(A, b, mu, var)``: the predictor ``eta = A x + b`` of a whole-site Gaussian node at
    ``fixed`` (params), and the mean and variance of each ``eta_n`` under q = ``lam``."""
    lp = fplan.linear_predictors[node]
    m, cov = gaussian_moments(lam, lay.q_family)

    def eta_of(x):
        return jnp.ravel(lp.eta_fn({**fixed, node: lay.to_site(x)}))

    mean = eta_of(m)
    A = jax.jacfwd(eta_of)(m)
    b = mean - A @ m
    var = jnp.maximum(jnp.einsum("nd,de,ne->n", A, cov, A), 0.0)
    return A, b, mean, var


def _predictor_sites(fplan: FactorPlan, lay, node: str, lam, fixed):
    """The sites ``(c1, c2)`` per predictor element at q = ``lam`` (t-SVGP Eq. 9): the
    Gauss-Hermite message's gradients w.r.t. each ``eta_n``'s mean and variance,
    ``c2 = dE/dv_n``, ``c1 = dE/dmu_n - 2 c2 mu_n``, so that ``exp(c1 eta + c2 eta^2)``
    per element is the message (Khan & Lin 2017, App. B.1)."""
    _, _, mean, var = _predictor_moments(fplan, lay, node, lam, fixed)
    return _sites_at(fplan, lay, node, lam, mean, var, fixed)


def _element_rewards(fplan: FactorPlan, lay, node: str, lam, fixed):
    """``reward(mean, var)``: the factor's summed reward at its predictor's moments (the
    residual variance of an integrated conditional added)."""
    lp = fplan.linear_predictors[node]
    shape = jnp.shape(lp.eta_fn({**fixed, node: lay.to_site(lay.fam.natural_to_mean(lam)[0])}))
    rest, residual = lp.point_rest(fixed)
    residual = jnp.ravel(jnp.broadcast_to(residual, shape))

    def flat_rest(e):
        return jnp.ravel(rest(jnp.reshape(e, shape)))

    def reward(mean, var):
        return jnp.sum(fplan.expected(flat_rest, mean, var + residual))

    return reward


def _sites_at(fplan: FactorPlan, lay, node: str, lam, mean, var, fixed):
    """The sites at the predictor's moments ``mean``, ``var`` (see _predictor_sites)."""
    reward = _element_rewards(fplan, lay, node, lam, fixed)
    d_mu, d_v = jax.grad(lambda m, v: reward(m, jnp.maximum(v, 0.0)), argnums=(0, 1))(mean, var)
    d_mu, d_v = jax.lax.stop_gradient(d_mu), jax.lax.stop_gradient(d_v)
    return d_mu - 2.0 * d_v * jax.lax.stop_gradient(mean), d_v


def _site_message(fplan: FactorPlan, lay, node: str, lam, sites, fixed):
    """The message of the sites ``(c1, c2)`` to the node through the predictor at
    ``fixed``: ``(A^T (c1 + 2 c2 b), A^T diag(c2) A)`` in mean-parameter gradients."""
    c1, c2 = sites
    A, b, _, _ = _predictor_moments(fplan, lay, node, jax.lax.stop_gradient(lam), fixed)
    return _message_of_sites(A, b, c1, c2)


def _message_of_sites(A, b, c1, c2):
    """The message of per-element sites ``exp(c1_n eta_n + c2_n eta_n^2)`` through the
    predictor ``eta = A x + b``, in natural parameters of x (t-SVGP Eq. 9)."""
    return (A.T @ (c1 + 2.0 * c2 * b), jnp.einsum("nd,n,ne->de", A, c2, A))


def _memory_message(fplan: FactorPlan, lay, node: str, lam, memory, plan, fixed):
    """The site memory's estimate of a subsampled factor's full-data message, and the
    updated memory (autocvi.plan.site_memory).

    ``memory = (c1, c2, seen, total)``: every plate element's last sites, whether it
    was visited yet, and the sites' message summed over the visited elements. The
    batch's sites are recomputed at q = ``lam`` and replace the old ones; the
    estimate is the sum of every element's last site, scaled by N / (elements seen)
    while the first pass is not complete (SAG, Schmidt, Le Roux & Bach 2017: the
    stored gradients of all terms, averaged over those seen). A site that is not
    finite (an overflowing link at a far-off q) keeps its old value.

    A memory of gradients (``plan.gradients``, a log-loss DLM reward;
    autocvi.plan.site_memory) holds each element's ``(dr/dm_n, dr/dv_n)`` in place of
    ``(c1_n, c2_n)`` and two more entries, each element's curvature ``k_n`` and their
    sum ``sum_n k_n a_n a_n^T``. Its estimate is SAGA's, ``sum_n g_n + (N/B - 1) sum_batch
    (g_n(q) - g_n)`` after the batch is stored (the fresh batch scaled by N/B, the plain
    minibatch estimate, until the first pass is complete), as the message whose
    gradient in q's mean is the estimate of ``sum_n a_n dr/dm_n``; the curvature is the
    stored sum's SAG estimate (:func:`_memory_curvature`), positive semi-definite.
    """
    c1_all, c2_all, seen, total = memory[:4]
    idx = fixed[plan.plate.name]
    A, b, mean, var = _predictor_moments(fplan, lay, node, jax.lax.stop_gradient(lam), fixed)
    # The factor's density carries numpyro's N/B scale: the memory holds each
    # element's own site.
    scale = plan.plate.size / plan.plate.subsample_size
    c1, c2 = (c / scale for c in _sites_at(fplan, lay, node, lam, mean, var, fixed))
    if plan.gradients:  # dr/dm_n (the site's c1 is dr/dm_n - 2 (dr/dv_n) m_n)
        c1, b = c1 + 2.0 * c2 * mean, jnp.zeros_like(b)
    ok = jnp.isfinite(c1) & jnp.isfinite(c2)
    c1, c2 = jnp.where(ok, c1, c1_all[idx]), jnp.where(ok, c2, c2_all[idx])
    d1, d2 = c1 - c1_all[idx], c2 - c2_all[idx]
    delta = _message_of_sites(A, b, d1, d2)
    total = jax.tree_util.tree_map(jnp.add, total, delta)
    seen = seen.at[idx].set(seen[idx] | ok)
    count = jnp.maximum(jnp.sum(seen), 1).astype(c1.dtype)
    estimate = jax.tree_util.tree_map(lambda t: t * (plan.plate.size / count), total)
    if plan.gradients:
        saga = (t + (scale - 1.0) * d for t, d in zip(total, delta))
        fresh = _message_of_sites(A, b, c1, c2)
        G, T2 = (jnp.where(jnp.all(seen), x, scale * f) for x, f in zip(saga, fresh))
        # (G - 2 T2 m, T2): the message whose gradient in the mean at q's mean m is G
        m = lay.fam.natural_to_mean(jax.lax.stop_gradient(lam))[0]
        estimate = (G - 2.0 * T2 @ m, T2)
    updated = (c1_all.at[idx].set(c1), c2_all.at[idx].set(c2), seen, total)
    if plan.gradients:  # each element's curvature (_log_loss_curvature) and their sum
        k_all, curvature = memory[4:]
        k = _curvature_at(fplan, lay, node, lam, mean, var, fixed) / scale
        k = jnp.where(ok & jnp.isfinite(k), k, k_all[idx])
        curvature = curvature + jnp.einsum("nd,n,ne->de", A, k - k_all[idx], A)
        updated += (k_all.at[idx].set(k), curvature)
    return estimate, updated


def _memory_curvature(memory, plan):
    """The full-data log-loss curvature estimated by a memory of gradients: the stored
    curvatures' sum, scaled by N over the elements seen while the first pass lasts."""
    seen, curvature = memory[2], memory[5]
    count = jnp.maximum(jnp.sum(seen), 1).astype(curvature.dtype)
    return curvature * (plan.plate.size / count)


def _vector_moments(lp, lay, node: str, m, cov, values):
    """``(mean, var, shape)``: each row's mean ``(N, K)`` and covariance ``(N, K, K)`` of
    a K-vector predictor ``eta = J x + b`` (shape ``shape``) under ``x ~ N(m, cov)``.

    ``eta`` is affine in ``x``, so its linear part is the same at every point: it is
    linearised once at zero and applied to ``m``, to the columns of ``cov`` and to the
    unit vectors, which costs D predictor evaluations each (a sparse GP's ``u @ A.T``:
    D K m B multiply-adds) where the dense ``J cov J^T`` over all N K rows would cost
    N K D^2; reverse mode through these maps is their transpose, as cheap.
    """

    def eta_of(x):
        return lp.eta_fn({**values, node: lay.to_site(x)})

    b, lin = jax.linearize(eta_of, jnp.zeros_like(jax.lax.stop_gradient(m)))
    shape = b.shape
    k = shape[-1]
    d = m.shape[-1]
    mean = jnp.reshape(b + lin(m), (-1, k))
    j_cov = jnp.reshape(jax.vmap(lin)(cov), (d, -1, k))
    j = jnp.reshape(jax.vmap(lin)(jnp.eye(d, dtype=m.dtype)), (d, -1, k))
    var = jnp.einsum("dnk,dnl->nkl", j_cov, j)
    return mean, 0.5 * (var + jnp.swapaxes(var, -1, -2)), shape


def _cubature_rest(lp, values, shape):
    """The predictor's rest on flat rows ``(N, K) -> (N,)``."""

    def rest(eta):
        return jnp.ravel(lp.rest_fn(jnp.reshape(eta, shape), values))

    return rest


def _cubature_surrogate(lp, lay, node: str, m, cov, values):
    """Per element, the rule's ``E[l_n]`` as a function of the predictor's moments whose
    gradients w.r.t. ``(m_n, V_n)`` are the rule's ``E[grad l_n]`` and ``E[hess l_n]/2``
    (Bonnet's and Price's theorems, :func:`~autocvi.analysis.expectations.spherical_radial`):
    ``E + g.(m_n - m_n*) + tr(H (V_n - V_n*))/2`` at the current moments ``*``. Its value
    is the ELBO term; ``jax.grad`` of it w.r.t. q's mean parameters is the CVI message."""
    mean, var, shape = _vector_moments(lp, lay, node, m, cov, values)
    sg = jax.lax.stop_gradient
    e, g, h = spherical_radial(_cubature_rest(lp, values, shape), sg(mean), sg(var))
    value = e + jnp.sum(g * (mean - sg(mean)), -1) + 0.5 * jnp.sum(h * (var - sg(var)), (-2, -1))
    return jnp.reshape(value, shape[:-1])


def _vector_sites_message(lp, lay, node: str, mu, c1, c2, values):
    """The message of per-element sites ``exp(c1_n^T eta_n + eta_n^T C2_n eta_n)``
    through a K-vector predictor, in natural parameters of x: the gradient w.r.t. q's
    mean parameters of their expectation ``sum_n c1_n^T m_n + tr(C2_n (V_n + m_n m_n^T))``,
    i.e. ``(J^T (c1 + 2 C2 b), J^T blockdiag(C2) J)`` (t-SVGP Eq. 9 with K x K blocks)."""

    def expected(mu):
        m, second = mu
        cov = second - m[:, None] * m[None, :]
        mean, var, _ = _vector_moments(lp, lay, node, m, cov, values)
        outer = mean[:, :, None] * mean[:, None, :]
        return jnp.sum(c1 * mean) + jnp.sum(c2 * (var + outer))

    g = jax.grad(expected)(jax.tree_util.tree_map(jax.lax.stop_gradient, mu))
    return (g[0], 0.5 * (g[1] + jnp.swapaxes(g[1], -1, -2)))


def _vector_memory_message(fplan: FactorPlan, lay, node: str, lam, memory, plan, fixed):
    """:func:`_memory_message` for a K-vector predictor (cubature sites): each element's
    site is ``c1_n = g_n - H_n m_n`` (K numbers) and ``C2_n = H_n / 2`` (K x K) from the
    rule's ``g_n = E[grad l_n]``, ``H_n = E[hess l_n]`` at the current q."""
    c1_all, c2_all, seen, total = memory
    idx = fixed[plan.plate.name]
    lp = fplan.linear_predictors[node]
    mu = lay.fam.natural_to_mean(jax.lax.stop_gradient(lam))
    # the moments from the natural parameters, not mu[1] - m m^T (float32 cancellation)
    m, cov = gaussian_moments(jax.lax.stop_gradient(lam), lay.q_family)
    mean, var, shape = _vector_moments(lp, lay, node, m, cov, fixed)
    # The factor's density carries numpyro's N/B scale: the memory holds each
    # element's own site.
    scale = plan.plate.size / plan.plate.subsample_size
    _, g, h = spherical_radial(_cubature_rest(lp, fixed, shape), mean, var)
    c1 = (g - jnp.einsum("nkl,nl->nk", h, mean)) / scale
    c2 = 0.5 * h / scale
    ok = jnp.all(jnp.isfinite(c1), -1) & jnp.all(jnp.isfinite(c2), (-2, -1))
    c1 = jnp.where(ok[:, None], c1, c1_all[idx])
    c2 = jnp.where(ok[:, None, None], c2, c2_all[idx])
    delta = _vector_sites_message(lp, lay, node, mu, c1 - c1_all[idx], c2 - c2_all[idx], fixed)
    total = jax.tree_util.tree_map(jnp.add, total, delta)
    seen = seen.at[idx].set(seen[idx] | ok)
    count = jnp.maximum(jnp.sum(seen), 1).astype(c1.dtype)
    estimate = jax.tree_util.tree_map(lambda t: t * (plan.plate.size / count), total)
    return estimate, (c1_all.at[idx].set(c1), c2_all.at[idx].set(c2), seen, total)


# How the site memory of each message kind refreshes its sites (autocvi.plan.site_memory).
_MEMORY_MESSAGES = {
    GAUSS_HERMITE.name: _memory_message,
    CUBATURE.name: _vector_memory_message,
}


def expected_log_factor(
    fplan: FactorPlan, layouts: dict, mean_params: dict, fixed=None, natural=None
):
    """``E_q[log p_a]`` of a factor whose every latent edge is conjugate (exact).

    Each latent neighbour is replaced by its moment nodes (a point set that
    reproduces E_q of every sufficient statistic); the factor is multi-affine in
    those statistics, so the tensor-product expectation is exact (DESIGN.md sec. 5).

    Args:
        fplan: the factor's plan (``schedule.factors[name]``).
        layouts: ``{latent: LatentLayout}`` (``schedule.nodes[n].layout``).
        mean_params: ``{latent: mean-parameter tuple}`` for the factor's latents.
        fixed: values of params and subsample indices the factor reads.
        natural: ``{latent: natural parameters}``, optional: Gaussian latents' nodes
            are then built from the moments these give (:func:`conjugate_point_set`),
            as the engine does.

    Raises:
        ValueError: when an edge is not conjugate (no closed form; the engine
            estimates that expectation instead).
    """
    bad = [j for j, conjugate in fplan.conjugate.items() if not conjugate]
    if bad:
        raise ValueError(
            f"factor {fplan.name!r} is not conjugate in {', '.join(bad)}: its expectation has "
            f"no closed form (see graph.explain({fplan.name!r}, {bad[0]!r}))."
        )
    sets = _conjugate_point_sets(fplan, layouts, mean_params, natural)
    return expect(fplan.log_density, sets, {} if fixed is None else fixed)


def _conjugate_point_sets(fplan, layouts, mean_params, natural, skip=None) -> dict:
    """Every conjugate latent's moment nodes (:func:`conjugate_point_set`) but ``skip``'s."""
    return {
        j: conjugate_point_set(
            layouts[j], mean_params[j], fplan.alignments[j], (natural or {}).get(j)
        )
        for j in fplan.latents
        if j != skip
    }


def vmp_message(
    fplan: FactorPlan, layouts: dict, latent: str, mean_params: dict, fixed=None, natural=None
):
    """The VMP message from a conjugate factor to ``latent``, in natural parameters.

    ``grad_{mu_i} E_q[log p_a]`` (Khan & Lin 2017, "Conjugate-computation
    variational inference", Sec. 5: for a conjugate factor the CVI gradient is
    the VMP message); the engine's exact messages are this function. ``natural``
    (optional, as the engine passes it): Gaussian latents are read from their natural
    parameters (:func:`mean_parameter_gradient`).
    """
    fixed = {} if fixed is None else fixed
    others = _conjugate_point_sets(fplan, layouts, mean_params, natural, skip=latent)

    def of_set(point_set):
        return expect(fplan.log_density, {**others, latent: point_set}, fixed)

    return mean_parameter_gradient(
        layouts[latent],
        of_set,
        mean_params[latent],
        fplan.alignments[latent],
        (natural or {}).get(latent),
    )


# Smallest |eigenvalue| over the largest of a message's precision that _near_the_factor
# takes for a point to evaluate at.
_WELL_CONDITIONED = 1e-4


def _near_the_factor(lay, message, lam_ref):
    """Where to evaluate a constant exact message to a Gaussian node a second time: the
    Gaussian the message itself is (a factor with the node as its only latent is
    quadratic in it, so the message is the same at every point, in exact arithmetic),
    elementwise where that is a valid Gaussian, else ``lam_ref``; and where it was valid
    (``(lam_at, ok)``: only there is the second evaluation used).

    In float32 the point matters. The moment nodes sit at ``m +- s``, and the message's
    second-order part is the difference of the factor's gradient at them: at a reference
    q near 0 for data near 30,000 (a Normal mean, sigma = 100, 100 points) that is 0.02
    out of gradients of 300, and the precision came out 5.5e-4 off, the mean 1.65
    posterior sd off. At the message's own mean the gradients at the nodes are
    opposite, and their difference exact to rounding."""
    batch_shape = jnp.shape(lay.fam.is_valid(lam_ref))
    ok = _valid(lay.fam, message, batch_shape)
    if lay.q_family == "MultivariateNormal":
        # and well-conditioned: a factor that reads the node along fewer directions than
        # it has (z ~ Normal(0.99 x, 0.14) in q(x, z)) gives a singular precision that
        # rounding can make look definite, and no usable point
        ev = jnp.linalg.eigvalsh(0.5 * (message[1] + jnp.swapaxes(message[1], -1, -2)))
        ok = ok & (ev[..., -1] < -_WELL_CONDITIONED * jnp.max(jnp.abs(ev), axis=-1))
    at = jax.tree_util.tree_map(lambda g, r: _where(ok, g, r), message, lam_ref)
    # Its mean, with the spread widened to at least |m|: the nodes' offsets are then not
    # lost to the rounding of m + offset (at m = 30,000 and sd 0.1, 4% of each offset).
    m, cov = gaussian_moments(at, lay.q_family)
    if lay.q_family == "MultivariateNormal":
        outer = jnp.einsum("...i,...j->...ij", m, m)
        return lay.fam.mean_to_natural((m, cov + 2.0 * outer)), ok
    return lay.fam.mean_to_natural((m, cov + 2.0 * m * m)), ok


def _rounding_matters() -> bool:
    """Whether floats are float32 (x64 off), where a constant exact message to a Gaussian
    node is evaluated a second time, near the factor (:func:`_near_the_factor`). In float64
    the reference point's rounding is 1e-16 of the message's scale (1e-12 at the data near
    30,000 that needed it in float32), and the second evaluation only costs: an
    eigendecomposition and two inverses of the node's precision, differentiated by every
    M-step that moves the prior (a GP's 175-point prior under variational EM: 6.0 -> 13.7 s
    per fit, ``benchmarks/gp_hyperparameters.py``'s EM on ionosphere)."""
    return jnp.result_type(float) == jnp.float32


def _is_gaussian(lay) -> bool:
    return lay.q_family in ("Normal", "MultivariateNormal")


def conjugate_point_set(lay, mu, align, lam=None) -> PointSet:
    """A conjugate neighbour's moment nodes: a Gaussian q's from its moments read from its
    natural parameters ``lam`` (:func:`autocvi.analysis.expectations.moments_point_set`:
    no cancellation in float32), any other q's from its mean parameters ``mu``."""
    if lam is not None and _is_gaussian(lay):
        return moments_point_set(lay, gaussian_moments(lam, lay.q_family), align)
    return moment_point_set(lay, mu, align)


def mean_parameter_gradient(lay, of_set, mu, align, lam=None):
    """``grad_mu E``, with ``E = of_set(moment nodes of q)``: the CVI message (Khan & Lin
    2017, Sec. 5) of a factor to a node whose q has mean parameters ``mu``.

    For a Gaussian q with natural parameters ``lam`` the nodes are built from its mean
    ``m`` and covariance ``S`` read from ``lam`` (:func:`conjugate_point_set`), and the
    gradient in ``(m, S)`` is chained to the mean parameters ``(m, S + m m^T)``:
    ``dE/dE[x x^T] = dE/dS`` and ``dE/dE[x] = dE/dm - 2 (dE/dS) m``; the same numbers,
    without the float32 cancellation of ``E[x x^T] - m m^T``."""
    if lam is None or not _is_gaussian(lay):
        return _symmetric(lay, jax.grad(lambda mu_: of_set(moment_point_set(lay, mu_, align)))(mu))
    m, cov = gaussian_moments(lam, lay.q_family)
    g_m, g_cov = jax.grad(
        lambda m_, cov_: of_set(moments_point_set(lay, (m_, cov_), align)), argnums=(0, 1)
    )(m, cov)
    if lay.q_family == "MultivariateNormal":
        g_cov = 0.5 * (g_cov + jnp.swapaxes(g_cov, -1, -2))
        return (g_m - 2.0 * jnp.einsum("...ij,...j->...i", g_cov, m), g_cov)
    return (g_m - 2.0 * g_cov * m, g_cov)


def _symmetric(lay, g):
    """An MVN message's matrix part symmetrised (the gradient w.r.t. E[x x^T])."""
    if lay.q_family == "MultivariateNormal":
        return (g[0], 0.5 * (g[1] + jnp.swapaxes(g[1], -1, -2)))
    return g


# Backtracking of safeguarded node steps: at most this many halvings, and a
# decrease of the node's ELBO terms within this relative slack counts as a tie.
_MAX_HALVINGS = 10
_LINE_SEARCH_SLACK = 1e-6
# A refused full step that would move a Gaussian q's means by less than this many sd
# and its variances by less than this fraction is a tie at the optimum (settled()).
_SETTLED_MOVE = 0.1
_SETTLED_VARIANCE = 0.15
# The first steps (and the first pass of a site memory) are searched from wherever the
# fit starts: a natural-parameter step from a start far wider than the posterior moves
# the mean by about beta x gradient / start precision, and a Poisson GLM started at
# b0 = 2 with variance 0.1, whose posterior is 6 +- 0.001, needed a step of 1e-4 (13
# halvings of 0.5); with 10, every step of a Poisson GLM with group intercepts and counts
# near 400 was refused and q never left its start. Later, a step refused after 10
# halvings is one the noise of its estimate refused: more would cost time, not help.
_FIRST_PASS_HALVINGS = 20
_START_ITERATIONS = 20


def _all_finite(tree):
    """Whether every element of every leaf of ``tree`` is finite (a scalar bool)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]))


def _local_message_scale(node, fplan) -> float:
    scale = 1.0
    shared = {p.name for p in fplan.subsampled}
    for _, plate in node.subsample_axes:
        if plate.name in shared:
            scale *= plate.subsample_size / plate.size
    return scale


def _gather(node, lam, indices):
    """The sampled elements of a local node's natural parameters."""
    for axis, plate in node.subsample_axes:
        lam = jax.tree_util.tree_map(
            lambda a, ax=axis, p=plate: jnp.take(a, indices[p.name], axis=ax), lam
        )
    return lam


def _scatter(node, full, sub, indices):
    """Write the updated sampled elements back into the full natural parameters."""
    if not node.subsample_axes:
        return sub
    ((axis, plate),) = node.subsample_axes
    idx = indices[plate.name]

    def put(a, b):
        moved = jnp.moveaxis(a, axis, 0).at[idx].set(jnp.moveaxis(b, axis, 0))
        return jnp.moveaxis(moved, 0, axis)

    return jax.tree_util.tree_map(put, full, sub)


def damped_update(fam, old, message, beta, halvings: int = 12):
    """``(1 - b) old + b message``, kept inside the natural domain per element.

    Families with a ``domain_preserving_step`` (the Gaussians: saddle-free
    curvature ``|P_t|``) take it where the plain step leaves the domain, so an
    indefinite expected Hessian (a non-log-concave factor, a start far in the
    tails) still moves q at the full step. Other families halve ``b`` per
    element until the step is valid. Elements for which nothing valid is
    found keep their old parameters.
    """
    batch_shape = jnp.shape(fam.is_valid(old))

    def combine(b):
        def leaf(o, m):
            bb = jnp.reshape(b, b.shape + (1,) * (o.ndim - b.ndim))
            return (1.0 - bb) * o + bb * m

        new = jax.tree_util.tree_map(leaf, old, message)
        return new, _valid(fam, new, batch_shape)

    b0 = jnp.full(batch_shape, beta, dtype=jnp.result_type(float))
    if fam.domain_preserving_step is not None:
        plain, ok = combine(b0)

        def repaired():  # computed only when some element needs it (an eigh per step)
            safe = fam.domain_preserving_step(old, message, b0)
            new = jax.tree_util.tree_map(lambda p, s: _where(ok, p, s), plain, safe)
            return new, _valid(fam, new, batch_shape)

        new, ok = jax.lax.cond(jnp.all(ok), lambda: (plain, ok), repaired)
    else:

        def halve(_, b):
            return jnp.where(combine(b)[1], b, 0.5 * b)

        b = jax.lax.fori_loop(0, halvings, halve, b0)
        new, ok = combine(b)
    return jax.tree_util.tree_map(lambda o, n: _where(ok, n, o), old, new)


def _is_log_loss(fplan: FactorPlan, node: str) -> bool:
    """The factor's reward for ``node`` is a log loss ``log E_q[p]`` (log-loss DLM with
    deterministic gradients) read through one scalar predictor per element."""
    lp = fplan.linear_predictors.get(node)
    return (
        lp is not None
        and lp.vector_size is None
        and fplan.expected is not expected_log_likelihood
        and not fplan.reward_reads_mean_only
        and not fplan.sampled_gradients
    )


def _log_loss_curvature(fplan: FactorPlan, lay, node: str, lam, fixed):
    """``(A, k)`` with ``k_n = max(-h_n, 0)``: ``A^T diag(k) A`` is minus the reward's
    Hessian in q's mean, with ``h_n = d^2 r_n / dm_n^2`` of each element's reward at its
    predictor's moments (exact, by autodiff) clipped at 0 (exact for a log-concave
    likelihood)."""
    A, _, mean, var = _predictor_moments(fplan, lay, node, jax.lax.stop_gradient(lam), fixed)
    return A, _curvature_at(fplan, lay, node, lam, mean, var, fixed)


def _curvature_at(fplan: FactorPlan, lay, node: str, lam, mean, var, fixed):
    """``k`` of :func:`_log_loss_curvature` at the predictor's moments ``mean``, ``var``."""
    reward = _element_rewards(fplan, lay, node, lam, fixed)

    def slope(mu):
        return jax.grad(lambda u: reward(u, var))(mu)

    _, h = jax.jvp(slope, (mean,), (jnp.ones_like(mean),))
    return jnp.maximum(-h, 0.0)


def _newton_mean_update(fam, old, message, curvature, beta):
    """CVI's step for a whole-site Gaussian whose messages include log-loss rewards, split
    as :meth:`autocvi.blocks.gaussian_block.GaussianBlock._alternating_update` splits a
    block's: the precision takes CVI's damped step towards the message's, and the mean a
    Newton step of size ``beta`` with the objective's own curvature ``curvature`` (minus its
    Hessian in the mean). For the log loss ``log E_q[p]`` CVI's site precision is not that
    curvature (it misses ``beta (dr/dm)^2``; Wei, Sheth & Khardon, *Direct Loss
    Minimization for Sparse Gaussian Processes*, Sec. 2, with the heat equation): from a
    broad start a logistic reward has no site precision at all (``dr/dv = 0`` at m = 0), and
    CVI's step moved an SVGP's inducing means on 100,000 points by thousands. The fixed
    points are CVI's: the mean's gradient ``t1 + 2 t2 m`` vanishes exactly where ``P m =
    t1``. Returns the new natural parameters and whether the step was finite (else the
    old ones)."""
    precision = -(old[1] + jnp.swapaxes(old[1], -1, -2))
    mean = jnp.linalg.solve(precision, old[0])
    gradient = message[0] + 2.0 * message[1] @ mean
    factor = jnp.linalg.cholesky(0.5 * (curvature + curvature.T))
    direction = jax.scipy.linalg.cho_solve((factor, True), gradient)
    stepped = damped_update(fam, old, message, beta)
    new_mean = mean + beta * direction
    new = (-2.0 * stepped[1] @ new_mean, stepped[1])
    finite = jnp.all(jnp.isfinite(new[0])) & jnp.all(jnp.isfinite(new[1]))
    return jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, old), finite


def _where(ok, a, b):
    """``where(ok, a, b)`` with ``ok`` of batch shape broadcast over event axes."""
    return jnp.where(jnp.reshape(ok, ok.shape + (1,) * (a.ndim - ok.ndim)), a, b)


def _valid(fam, lam, batch_shape):
    ok = fam.is_valid(lam)
    for leaf in jax.tree_util.tree_leaves(lam):
        finite = jnp.isfinite(leaf)
        extra = tuple(range(len(batch_shape), leaf.ndim))
        ok = ok & (jnp.all(finite, axis=extra) if extra else finite)
    return ok


def _expected_hessian(lay, xs, m, precision, grads, hessians):
    """``E_q[hess f]`` from draws ``xs`` of q (mean ``m``, ``precision``), with ``f``'s
    gradients and pointwise Hessians there: Stein's identity
    ``E[hess f] = P E[(x - m) grad f^T]`` with the pointwise Hessians as control variate,

        H = P mean((x - m) g^T) - (P mean((x - m)(x - m)^T) - I) mean(h).

    The control variate has mean zero (``E[(x - m)(x - m)^T] = P^-1``), so H is unbiased
    for any ``f`` whose gradient has bounded variation, kinks included; the mean of the
    pointwise Hessians alone is not: a Laplace prior's ``-|w| / b`` has Hessian 0 almost
    everywhere, and its curvature (``2 N(0 | m, s^2) / b``, a point mass at the kink) never
    reached q (a scalar Laplace-prior model's q had the likelihood's sd alone, 1.9x the best
    Gaussian's, reported converged). For a quadratic ``f`` H is exact whatever the draws
    (the pointwise Hessian is then constant), as the mean of the Hessians was; for smooth
    ``f`` the two differ by terms of third order in ``x - m``.
    """
    d = xs - m[None]
    mean_h = jnp.mean(hessians, 0)
    # Written as mean(h) + P mean((x - m) r^T) with the residual r = g - mean(h) (x - m):
    # for a near-quadratic f the residual is small, so float32's rounding in P (a joint
    # group's precision can be ill-conditioned) multiplies a small number.
    if lay.q_family == "MultivariateNormal":
        residual = grads - jnp.einsum("...ij,s...j->s...i", mean_h, d)
        correction = precision @ jnp.mean(d[..., :, None] * residual[..., None, :], 0)
        return mean_h + 0.5 * (correction + jnp.swapaxes(correction, -1, -2))
    return mean_h + precision * jnp.mean(d * (grads - mean_h * d), 0)


def _hessian(f, x, lay, separable):
    """Per-element Hessian blocks of ``f`` at ``x`` in the family layout.

    Normal: the diagonal (shape of x). MVN: ``plate_shape + (D, D)``. When the
    factor is separable over the node's element axes, Hessian-vector products
    with broadcast basis vectors give every block at once.
    """
    grad = jax.grad(f)
    if lay.q_family == "Normal":
        if separable:
            return jax.jvp(grad, (x,), (jnp.ones_like(x),))[1]
        n = x.size
        full = jax.jacfwd(grad)(x).reshape(n, n)
        return jnp.diagonal(full).reshape(x.shape)
    d = x.shape[-1]
    if x.ndim == 1:
        return jax.hessian(f)(x)
    if separable:
        eye = jnp.eye(d, dtype=x.dtype)
        cols = jax.vmap(lambda e: jax.jvp(grad, (x,), (jnp.broadcast_to(e, x.shape),))[1])(eye)
        return jnp.moveaxis(cols, 0, -1)
    n = x.size
    full = jax.jacfwd(grad)(x).reshape(x.shape[:-1] + (d,) + x.shape[:-1] + (d,))
    plates = x.shape[:-1]
    flat = full.reshape(int(jnp.prod(jnp.array(plates))), d, -1, d)
    idx = jnp.arange(flat.shape[0])
    del n
    return flat[idx, :, idx, :].reshape(plates + (d, d))


def _fisher_solve(fam, lam, g):
    """Solve ``F(lam) x = g`` per element, ``F = hess A`` (CVI App. F)."""
    leaves, treedef = jax.tree_util.tree_flatten(lam)
    batch_shape = jnp.shape(fam.log_partition(lam))
    nb = len(batch_shape)
    sizes = [int(jnp.size(leaf[(0,) * nb])) if leaf.ndim > nb else 1 for leaf in leaves]

    def flatten(tree):
        parts = [jnp.reshape(leaf, batch_shape + (-1,)) for leaf in jax.tree_util.tree_leaves(tree)]
        return jnp.concatenate(parts, axis=-1)

    def unflatten(flat):
        out, start = [], 0
        for leaf, size in zip(leaves, sizes):
            out.append(jnp.reshape(flat[..., start : start + size], leaf.shape))
            start += size
        return jax.tree_util.tree_unflatten(treedef, out)

    def grad_a(flat):
        return flatten(jax.grad(lambda lm: jnp.sum(fam.log_partition(lm)))(unflatten(flat)))

    flat = flatten(lam)
    d = flat.shape[-1]
    eye = jnp.eye(d, dtype=flat.dtype)
    cols = jax.vmap(lambda e: jax.jvp(grad_a, (flat,), (jnp.broadcast_to(e, flat.shape),))[1])(eye)
    fisher = jnp.moveaxis(cols, 0, -1)
    sol = jnp.linalg.solve(fisher, flatten(g)[..., None])[..., 0]
    return unflatten(sol)


def collapsed(lam, q_family: str, xp=jnp):
    """Whether any coordinate of a Gaussian q (natural parameters ``lam``) has a variance
    at or below rounding of its mean: ``1e-20`` (float64) or ``1e-12`` (float32) times
    ``1 + mean^2``, a standard deviation below about ``1e-10`` or ``1e-6`` of the mean
    (some ten units in the last place), or a variance that is not positive. The line
    search refuses such a step, and ``fit``'s diagnostics flag such a q.

    The variance is read from the natural parameters, not as ``E[x^2] - E[x]^2``: in
    float32 that difference cancels below ``1e-7 mean^2``, and a minibatched Poisson GLM
    whose intercept's posterior is 6 +- 0.001 (2,000 counts near 400) was called
    collapsed and refused its steps."""
    mean, var = gaussian_mean_variance(lam, q_family, xp)
    tiny = 1e-20 if xp.asarray(mean).dtype == xp.float64 else 1e-12
    return xp.any(~(var > tiny * (1.0 + xp.abs(mean) ** 2)))


def _pairing(g, mu):
    """``<g, mu>``: a message (the gradient of an expected log factor in the mean
    parameters) paired with mean parameters of the same structure."""
    pairs = jax.tree_util.tree_map(lambda a, b: jnp.sum(a * b), g, mu)
    return sum(jax.tree_util.tree_leaves(pairs))


def _constant_terms(graph, params, fixed):
    """Log densities of factors that touch no latent (they shift the ELBO only)."""
    total = 0.0
    for fac in graph.factors.values():
        if not fac.latents:
            total = total + jnp.sum(graph.log_density_fn(fac.name)({**params, **fixed}))
    return total
