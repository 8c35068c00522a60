"""``print_summary``: a posterior table in the style of ``numpyro.diagnostics.print_summary``.

One row per element of every site (``w[0]``, ``w[1]``, ..., ``L[0,1]``), all
of them, with columns mean, std, median and the two quantiles of the central
``prob`` interval (5.0% and 95.0% for ``prob=0.9``). Unlike NumPyro's table
(HPDI of MCMC draws, plus n_eff and r_hat), the interval is equal-tailed and
the numbers come from q itself: exact moments and quantiles where the family
has them (:mod:`autocvi.infer.guide` says which), Gauss-Hermite quadrature for
the moments of a transformed Gaussian, and 4000 draws otherwise.
"""

from __future__ import annotations

from itertools import product

import jax
import numpy as np
from numpyro.distributions import Distribution

from .guide import CVIGuide, marginal_moments, marginal_quantiles

__all__ = ["print_summary", "summary"]


def summary(posterior_or_result, *, prob: float = 0.9, group_by_chain: bool = False) -> dict:
    """Site -> ``{"mean", "std", "median", "5.0%", "95.0%"}`` arrays of the site's shape.

    Accepts what :func:`print_summary` accepts.
    """
    posterior = _as_posterior(posterior_or_result)
    lo_p, hi_p = (1.0 - prob) / 2.0, (1.0 + prob) / 2.0
    lo_name, hi_name = f"{100 * lo_p:.1f}%", f"{100 * hi_p:.1f}%"
    out = {}
    for name, q in posterior.items():
        if isinstance(q, Distribution):
            mean, std, _ = marginal_moments(q)
            quants, _ = marginal_quantiles(q, [0.5, lo_p, hi_p])
        else:  # draws
            x = np.asarray(q, dtype=float)
            if group_by_chain:
                x = x.reshape((-1,) + x.shape[2:])
            mean, std = x.mean(axis=0), x.std(axis=0)
            quants = np.quantile(x, [0.5, lo_p, hi_p], axis=0)
        out[name] = {
            "mean": np.asarray(mean, dtype=float),
            "std": np.asarray(std, dtype=float),
            "median": np.asarray(quants[0], dtype=float),
            lo_name: np.asarray(quants[1], dtype=float),
            hi_name: np.asarray(quants[2], dtype=float),
        }
    return out


def print_summary(posterior_or_result, *, prob: float = 0.9, group_by_chain: bool = False) -> None:
    """Print mean, std, median and the central ``prob`` interval of every element of every site.

    Args:
        posterior_or_result: a dict site -> numpyro Distribution
            (``CVI.get_posterior(state)``, ``FitResult.posterior``), a
            ``FitResult``, a :class:`~autocvi.infer.guide.CVIGuide`, or a dict
            site -> draws (leading axis the draws, as NumPyro's table).
        prob: mass of the central interval (equal-tailed quantiles).
        group_by_chain: for draws only: the two leading axes are chain and draw.
    """
    stats = summary(posterior_or_result, prob=prob, group_by_chain=group_by_chain)
    if not stats:
        return
    labels = {}
    for name, s in stats.items():
        shape = s["mean"].shape
        if shape:
            labels[name] = [
                (f"{name}[{','.join(map(str, idx))}]", idx) for idx in product(*map(range, shape))
            ]
        else:
            labels[name] = [(name, ())]
    width = max(10, max(len(label) for rows in labels.values() for label, _ in rows))
    name_format = "{:>" + str(width) + "}"
    columns = list(next(iter(stats.values())).keys())
    print()
    print((name_format + " {:>9}" * len(columns)).format("", *columns))
    row_format = name_format + " {:>9.2f}" * len(columns)
    for name, s in stats.items():
        for label, idx in labels[name]:
            print(row_format.format(label, *[float(s[c][idx]) for c in columns]))
    print()


def _as_posterior(obj) -> dict:
    if isinstance(obj, CVIGuide):
        return obj.get_posterior()
    if hasattr(obj, "posterior") and isinstance(obj.posterior, dict):  # FitResult
        return obj.posterior
    if isinstance(obj, dict):
        return {k: v if isinstance(v, Distribution) else jax.device_get(v) for k, v in obj.items()}
    raise TypeError(
        "print_summary expects a dict of numpyro Distributions (CVI.get_posterior(state)), a "
        f"FitResult, a CVIGuide or a dict of draws; got {type(obj).__name__}. For a CVI.run "
        "result, pass cvi.get_posterior(result.state)."
    )
