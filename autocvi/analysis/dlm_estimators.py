"""Sampling estimators of the gradient of ``log E_{N(f | m, v)}[p(y | f)]`` (log-loss DLM).

From Wei, Sheth & Khardon, *Direct Loss Minimization for Sparse Gaussian
Processes* (AISTATS 2021). Per element, with ``l(f) = log p(y | f)`` and
``f = m + sqrt(v) eps``:

* **bMC** (Sec. 4, Eqs. 7-8): the ratio of Monte Carlo averages,
  ``d/dm = sum_k p_k l'_k / sum_k p_k`` and
  ``d/dv = sum_k p_k (l''_k + l'_k^2) / (2 sum_k p_k)`` (``p'' = p (l'' + l'^2)``);
  biased, the bias shrinks as 1 / L.
* **smooth-bMC** (App. B): ``nu`` added to the denominator's average,
  ``(1/L) sum_k p_k + nu``: bounded steps, a little more bias where ``E[p]`` is
  small.
* **uPS** (Sec. 3, Prop. 1; App. A): unbiased. The gradient of
  ``log E_q[p]`` is ``E_{q~}[grad log q(f)]`` under ``q~(f) ~ q(f) p(y | f)``:
  ``d/dm = E[(f - m) / v]``, ``d/dv = E[((f - m)^2 - v) / (2 v^2)]``. Draws of ``q~``
  come from rejection sampling with the proposal ``N(m, n v)``, ``n <= 10`` the
  largest width with ``max_{[a, b]} p <= p_max / sqrt(n)`` on the interval
  ``[a, b] = m +- sqrt(v log n / (1 - 1/n))`` where q exceeds the proposal
  (the paper's width rule), and the bound ``K = p_max``. Proposals run vectorised
  over elements and draws, up to :data:`MAX_ROUNDS` rounds; an element with a draw
  still rejected after them gets the bMC estimate (the paper's fallback is a
  per-element sampler, which a compiled program cannot run unboundedly).

``p_max`` is the likelihood's largest value, found by Newton steps on ``l`` from
``m`` (each halved until it raises ``l``): the supremum for the log-concave
likelihoods the paper bounds in Table 1 (logistic, probit, Poisson, Gaussian,
where the supremum of a logistic is approached as ``f -> +-inf``), with a margin of
:data:`_BOUND_MARGIN` nats so that an approached supremum is still a bound.

Each function maps ``(rest, mean, var, key, num_samples)`` to ``(d/dmean, d/dvar)``
per element, ``rest`` mapping predictors of ``mean``'s shape to per-element log
densities (element n reads predictor n only).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["bmc_gradient", "smooth_bmc_gradient", "ups_gradient", "MAX_ROUNDS"]

# Rejection rounds of uPS before an element falls back to bMC.
MAX_ROUNDS = 64
_BOUND_MARGIN = 1e-3
_MODE_STEPS = 20
_HALVINGS = 12
_MAX_WIDTH = 10


def _derivatives(rest, f):
    """``(l, l', l'')`` elementwise at ``f`` (shaped like the mean)."""

    def total(x):
        return jnp.sum(rest(x))

    d1, d2 = jax.jvp(jax.grad(total), (f,), (jnp.ones_like(f),))
    return rest(f), d1, d2


def _ratio_gradient(rest, mean, var, eps, smoothing):
    f = mean[None] + jnp.sqrt(var)[None] * eps
    log_p, d1, d2 = jax.vmap(lambda x: _derivatives(rest, x))(f)
    w = jax.nn.softmax(log_p, axis=0)
    gm = jnp.sum(w * d1, axis=0)
    gv = 0.5 * jnp.sum(w * (d2 + d1**2), axis=0)
    if smoothing > 0:
        # (1/L) sum p / ((1/L) sum p + nu), in logs: p can underflow
        log_mean_p = jax.scipy.special.logsumexp(log_p, axis=0) - jnp.log(log_p.shape[0])
        shrink = jax.nn.sigmoid(log_mean_p - jnp.log(smoothing))
        gm, gv = shrink * gm, shrink * gv
    return gm, gv


def bmc_gradient(rest, mean, var, key, num_samples: int):
    """bMC (Eqs. 7-8): ratio of Monte Carlo averages over ``num_samples`` draws."""
    eps = jax.random.normal(key, (num_samples,) + jnp.shape(mean), jnp.result_type(mean))
    return _ratio_gradient(rest, mean, var, eps, 0.0)


def smooth_bmc_gradient(rest, mean, var, key, num_samples: int, smoothing: float = 1e-4):
    """smooth-bMC (App. B): bMC with ``nu = smoothing`` added to the average of p."""
    eps = jax.random.normal(key, (num_samples,) + jnp.shape(mean), jnp.result_type(mean))
    return _ratio_gradient(rest, mean, var, eps, smoothing)


def _log_bound(rest, mean):
    """``(log p_max, mode)``: Newton steps on ``l`` from ``mean``, each halved (up to
    :data:`_HALVINGS` times) until it raises ``l``, elementwise; plus the margin."""

    def step(carry, _):
        f, log_p = carry
        _, d1, d2 = _derivatives(rest, f)
        full = -d1 / jnp.minimum(d2, -1e-6)
        best_f, best = f, log_p
        for k in reversed(range(_HALVINGS + 1)):  # the longest improving step wins
            new = f + full * 0.5**k
            log_p_new = rest(new)
            better = jnp.isfinite(log_p_new) & (log_p_new > log_p)
            best_f = jnp.where(better, new, best_f)
            best = jnp.where(better, log_p_new, best)
        return (best_f, best), None

    (mode, l_mode), _ = jax.lax.scan(step, (mean, rest(mean)), None, length=_MODE_STEPS)
    return l_mode + _BOUND_MARGIN, mode


def _width(rest, mean, sd, log_bound, mode):
    """The paper's width rule: the largest ``n <= 10`` with ``max_{[a, b]} l <=
    log p_max - log(n) / 2`` (the maximum of a unimodal ``l`` on the interval is at
    the mode clipped to it)."""
    best = jnp.ones_like(mean)
    for n in range(2, _MAX_WIDTH + 1):
        r = sd * jnp.sqrt(jnp.log(n) / (1.0 - 1.0 / n))
        l_interval = rest(jnp.clip(mode, mean - r, mean + r))
        best = jnp.where(l_interval <= log_bound - 0.5 * jnp.log(n), float(n), best)
    return best


def ups_gradient(rest, mean, var, key, num_samples: int):
    """uPS (Prop. 1 with App. A's rejection sampler): unbiased."""
    dtype = jnp.result_type(mean)
    sd = jnp.sqrt(var)
    log_bound, mode = _log_bound(rest, mean)
    width = _width(rest, mean, sd, log_bound, mode)
    shape = (num_samples,) + jnp.shape(mean)

    def log_accept(f):
        # log [q(f) p(y | f) / (p_max h(f))], h = N(mean, width var)
        z2 = (f - mean) ** 2 / var
        return (
            -0.5 * z2 * (1.0 - 1.0 / width) + 0.5 * jnp.log(width) + jax.vmap(rest)(f) - log_bound
        )

    def round_(carry):
        r, draws, accepted = carry
        k1, k2 = jax.random.split(jax.random.fold_in(key, r))
        f = mean + jnp.sqrt(width) * sd * jax.random.normal(k1, shape, dtype)
        take = (~accepted) & (jnp.log(jax.random.uniform(k2, shape, dtype)) < log_accept(f))
        return r + 1, jnp.where(take, f, draws), accepted | take

    def more(carry):
        r, _, accepted = carry
        return (r < MAX_ROUNDS) & ~jnp.all(accepted)

    start = (0, jnp.broadcast_to(mean, shape), jnp.zeros(shape, bool))
    _, draws, accepted = jax.lax.while_loop(more, round_, start)
    dev = draws - mean
    gm = jnp.mean(dev, axis=0) / var
    gv = jnp.mean(dev**2 - var, axis=0) / (2.0 * var**2)
    fallback = bmc_gradient(rest, mean, var, jax.random.fold_in(key, MAX_ROUNDS), num_samples)
    done = jnp.all(accepted, axis=0)
    return jnp.where(done, gm, fallback[0]), jnp.where(done, gv, fallback[1])
