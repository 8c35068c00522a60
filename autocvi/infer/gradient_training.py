"""Gradient training of q (Adam or any optax optimiser) on autocvi's objectives.

``autocvi.fit(model, data, objective=..., optimizer=optax.adam(0.01), num_steps=...)``
trains the same q on the same objective as CVI's natural-gradient steps, by ordinary
gradient steps on q's parameters: each Gaussian latent's mean and the Cholesky factor of
its covariance, ``q = N(m, L L^T)`` with ``log diag(L)`` unconstrained. It is the training
of Wei, Sheth & Khardon, *Direct Loss Minimization for Sparse Gaussian Processes*
(AISTATS 2021), Sec. 5 ("all methods are optimised with Adam"), and of NumPyro's SVI
with ``AutoMultivariateNormal``, inside autocvi: for the comparison the paper makes
(how many iterations each training needs), on any model autocvi plans.

The coordinates are the planner's (:mod:`autocvi.analysis.layout`): a latent with its
own ``MultivariateNormal`` prior is whitened (``u = loc + chol(K) v``, ``v ~ N(0, I)``
a priori), so ``(m, L)`` is q over ``v``: the paper's whitened parameterisation. The
objective is the schedule's (``CVIAlgorithm.elbo``: the ELBO, the beta-ELBO, or DLM's
``sum_n log E_q[p(y_n | f_n)] / beta - KL``, by the same quadrature), so both trainings
optimise one function and their optima agree.

Only Gaussian q's are trained this way (the Cholesky parameterisation is what the paper
and SVI train); :func:`check_trainable` names any other latent. A schedule whose
objective is a sampling estimate's surrogate (DLM's ``gradient="bmc" | "ups"``) is
refused too: its gradient exists inside CVI's messages only.

Pure functions over pytrees: :func:`init` and the chunk program of :func:`chunk_runner`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..families import gaussian_moments
from ..jaxpr import structural_jit

__all__ = ["GradientState", "check_trainable", "init", "chunk_runner", "CHUNK"]

# Steps per compiled chunk (a fixed length: the last chunk masks the steps beyond
# num_steps, so one program serves every num_steps).
CHUNK = 100

# The Gaussian q families and their parameters: (mean, scale) -> natural parameters,
# and natural parameters -> (mean, scale).
_GAUSSIAN = ("Normal", "MultivariateNormal")


class GradientState(NamedTuple):
    """The state of a gradient-trained fit.

    ``natural``: q's natural parameters per latent (what ``FitResult`` reads, as with
    ``CVIState``); ``q``: per latent ``(mean, scale)``, the optimiser's parameters
    (``scale``: the lower Cholesky factor with its diagonal's log, or a Normal's log sd);
    ``opt_state``: the optimiser's state; ``rng_key``: the key of the next step's draws
    (Monte Carlo terms, minibatches); ``iteration``: steps taken.
    """

    natural: dict
    q: dict
    opt_state: Any
    rng_key: jax.Array
    iteration: jax.Array


def check_trainable(schedule) -> None:
    """Raise ``NotImplementedError`` naming what gradient training cannot take: a latent
    whose q is not Gaussian, or an objective whose gradient is a sampling estimate."""
    for name, node in schedule.nodes.items():
        family = node.layout.q_family
        if family not in _GAUSSIAN:
            raise NotImplementedError(
                f"optimizer=: latent {name!r} has a {family} q, and gradient training takes "
                f"Gaussian q's only (mean and Cholesky factor, as the DLM paper and SVI's "
                f"AutoMultivariateNormal train them). Fit without optimizer= (CVI's "
                f"natural-gradient steps take every family autocvi plans)."
            )
    if schedule.objective.sampled_gradients:
        raise NotImplementedError(
            "optimizer=: the objective's gradient is a sampling estimate (DLM's "
            "gradient='bmc' / 'smooth-bmc' / 'ups'), which exists inside CVI's messages "
            "only; gradient training differentiates the quadrature objective itself. Use "
            "DLM(beta) without gradient=, or fit without optimizer=."
        )


def scale_of(family: str, lam):
    """``(mean, scale)`` of a Gaussian q from its natural parameters ``(P m, -P/2)``."""
    if family == "Normal":
        var = -0.5 / lam[1]
        return lam[0] * var, 0.5 * jnp.log(var)
    mean, cov = gaussian_moments(lam, family)
    tril = jnp.linalg.cholesky(cov)
    diag = jnp.diagonal(tril, axis1=-2, axis2=-1)
    return mean, _with_diagonal(tril, jnp.log(diag))


def natural_of(family: str, mean, scale):
    """Natural parameters ``(P m, -P/2)`` of ``N(mean, L L^T)`` (or ``N(mean, exp(2 s))``)."""
    if family == "Normal":
        precision = jnp.exp(-2.0 * scale)
        return mean * precision, -0.5 * precision
    tril = _with_diagonal(scale, jnp.exp(jnp.diagonal(scale, axis1=-2, axis2=-1)))
    eye = jnp.broadcast_to(jnp.eye(tril.shape[-1], dtype=tril.dtype), tril.shape)
    inv = jax.scipy.linalg.solve_triangular(tril, eye, lower=True)  # L^-1
    precision = jnp.einsum("...ki,...kj->...ij", inv, inv)  # L^-T L^-1
    return jnp.einsum("...ij,...j->...i", precision, mean), -0.5 * precision


def _with_diagonal(square, diagonal):
    """``square``'s strictly lower triangle with ``diagonal`` on the diagonal."""
    eye = jnp.eye(square.shape[-1], dtype=square.dtype)
    return jnp.tril(square, -1) + diagonal[..., None] * eye


def _natural(families: dict, q: dict) -> dict:
    return {n: natural_of(families[n], *q[n]) for n in q}


def init(optimizer, families: dict, natural: dict, rng_key) -> GradientState:
    """The state at q = ``natural`` (the planner's start, or a resumed fit's q)."""
    q = {n: scale_of(families[n], natural[n]) for n in families}
    return GradientState(
        _natural(families, q), q, optimizer.init(q), rng_key, jnp.zeros((), jnp.int32)
    )


def chunk_runner(optimizer, families: dict, objective, deterministic: bool):
    """A compiled ``(state, base, remaining) -> (state, values)``: :data:`CHUNK` steps of
    ``optimizer`` on ``-objective(base with natural=q's, key)``, the steps beyond
    ``remaining`` frozen. ``values``: the objective at q before each step (NaN where
    frozen). ``objective(state, key)`` is ``CVIAlgorithm.elbo``; ``base`` the CVIState
    whose natural parameters are replaced; with ``deterministic`` every step evaluates it
    at the base's own key (no draws), else at a fresh key per step."""

    def value(q, base, key):
        return objective(base._replace(natural=_natural(families, q)), key)

    def body(carry, _):
        state, base, remaining = carry
        key = jax.random.fold_in(state.rng_key, state.iteration)
        at = jax.random.fold_in(base.rng_key, 1) if deterministic else key
        v, grad = jax.value_and_grad(value)(state.q, base, at)
        negative = jax.tree_util.tree_map(jnp.negative, grad)
        updates, opt_state = optimizer.update(negative, state.opt_state, state.q)
        q = jax.tree_util.tree_map(jnp.add, state.q, updates)
        new = GradientState(_natural(families, q), q, opt_state, state.rng_key, state.iteration + 1)
        active = remaining > 0
        state = jax.tree_util.tree_map(lambda a, b: jnp.where(active, a, b), new, state)
        return (state, base, remaining - 1), jnp.where(active, v, jnp.nan)

    @structural_jit
    def run(state, base, remaining):
        (state, _, _), values = jax.lax.scan(body, (state, base, remaining), None, CHUNK)
        return state, values

    return run


def run(runner, state: GradientState, base, num_steps: int, progress_bar: bool = False):
    """``num_steps`` steps: ``(state, values)``, ``values[t]`` the objective before step t."""
    bar = None
    if progress_bar and num_steps > 1:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_steps, desc="optimizer", leave=False)
    values, done = [], 0
    while done < num_steps:
        state, chunk = runner(state, base, np.asarray(num_steps - done, np.int32))
        ran = min(CHUNK, num_steps - done)
        values.append(np.asarray(chunk)[:ran])
        done += ran
        if bar is not None:
            bar.update(ran)
            bar.set_postfix_str(f"objective {values[-1][-1]:.4f}")
    if bar is not None:
        bar.close()
    return state, np.concatenate(values)
