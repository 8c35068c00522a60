"""Choosing beta on a validation split (DLM paper, Sec. 5: "grid search with a
validation set on an exponentially-spaced grid, beta = [n, n/2, n/4, ..., 0.01]").

``choose_beta(model, train, valid)`` fits the model once per beta of the grid with
:func:`autocvi.fit` and keeps the fit whose predictive distribution has the lowest log
loss on the validation data, ``-mean_n log E_q[p(y_n | theta)]`` (Monte Carlo over q's
draws, numpyro's ``log_likelihood`` for the per-observation densities).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.infer import Predictive
from numpyro.infer.util import log_likelihood

from ..analysis.classify import trace
from ..analysis.objectives import DLM, Objective
from .fit import FitResult, fit

__all__ = ["BetaChoice", "beta_grid", "choose_beta", "predictive_log_loss"]


def beta_grid(n: int, smallest: float = 0.01) -> tuple[float, ...]:
    """The paper's grid ``n, n/2, n/4, ...`` down to ``smallest`` (included), largest first."""
    if n <= 0 or smallest <= 0:
        raise ValueError(f"beta_grid needs n > 0 and smallest > 0, got n={n}, smallest={smallest}")
    grid, beta = [], float(n)
    while beta > smallest:
        grid.append(beta)
        beta /= 2.0
    return (*grid, float(smallest))


def predictive_log_loss(result: FitResult, model, data: dict, num_samples=1000, rng_key=0):
    """``-mean_n log (1/S sum_s p(y_n | theta_s))`` with ``theta_s`` drawn from q.

    ``data`` holds the model's keyword arguments with the observations to score; every
    observed site's elements count as observations. Latents that q does not hold (an
    integrated conditional, SVGP's ``f``) are drawn from the model given each draw.
    """
    key = jax.random.PRNGKey(rng_key) if isinstance(rng_key, int) else rng_key
    key_q, key_rest = jax.random.split(key)
    draws = result.sample(key_q, num_samples)
    fixed = handlers.substitute(model, data=dict(result.params)) if result.params else model
    # Latents q does not hold (a conditional integrated into its child, as SVGP's f) are
    # drawn from the model given q's draws, a fresh key per draw.
    sites = handlers.trace(handlers.seed(fixed, 0)).get_trace(**data)
    missing = [
        n
        for n, site in sites.items()
        if site["type"] == "sample" and not site["is_observed"] and n not in draws
    ]
    if missing:
        rest = Predictive(fixed, posterior_samples=draws, return_sites=missing)(key_rest, **data)
        draws = {**draws, **rest}
    per_site = log_likelihood(fixed, draws, **data)
    total, count = 0.0, 0
    for values in per_site.values():
        flat = jnp.reshape(values, (values.shape[0], -1))
        lpd = jax.scipy.special.logsumexp(flat, axis=0) - jnp.log(flat.shape[0])
        total += float(jnp.sum(lpd))
        count += flat.shape[1]
    return -total / count


@dataclass
class BetaChoice:
    """What :func:`choose_beta` found.

    ``beta``: the chosen value; ``result``: its fit; ``scores``: beta -> validation log
    loss (nats per observation); ``results``: beta -> fit (all of them).
    """

    beta: float
    result: FitResult
    scores: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict, repr=False)


def _num_observations(model, train: dict) -> int:
    graph = trace(model, train)
    sizes = [int(np.prod(v.batch_shape)) for v in graph.variables.values() if v.observed]
    if not sizes:
        raise ValueError("choose_beta: the model has no observed site to score")
    return max(sizes)


def choose_beta(
    model,
    train: dict,
    valid: dict,
    *,
    objective: Callable[[float], Objective] = DLM,
    betas=None,
    num_samples: int = 1000,
    rng_key=0,
    **fit_kwargs,
) -> BetaChoice:
    """Fit ``objective(beta)`` for every beta and keep the best on ``valid``.

    Args:
        model: a NumPyro model.
        train, valid: the model's keyword arguments for fitting and for scoring.
        objective: beta -> an objective (default ``autocvi.DLM``, the log loss; pass
            ``autocvi.BetaELBO`` for the beta-ELBO, as the paper also does).
        betas: the grid (default :func:`beta_grid` of the number of training
            observations, the paper's).
        num_samples: q's draws per validation score.
        fit_kwargs: passed to :func:`autocvi.fit` (``progress_bar`` defaults to False).

    Each beta is one ``fit``; beta is an input of the compiled programs, not part of
    them, so only the first beta compiles (about 0.3 s per further beta on the DLM
    regression example instead of 2.5 s).
    """
    if betas is None:
        betas = beta_grid(_num_observations(model, train))
    fit_kwargs.setdefault("progress_bar", False)
    scores, results = {}, {}
    for beta in betas:
        result = fit(model, train, objective=objective(float(beta)), **fit_kwargs)
        results[float(beta)] = result
        scores[float(beta)] = predictive_log_loss(result, model, valid, num_samples, rng_key)
    finite = {b: s for b, s in scores.items() if np.isfinite(s)}
    if not finite:
        raise ValueError(f"choose_beta: no beta gave a finite validation score ({scores})")
    best = min(finite, key=finite.get)
    return BetaChoice(best, results[best], scores, results)
