"""Scoring a fit of a zoo model against its stored references (no JAX config changes).

``reference(name)`` reads ``references/<name>.json``; ``canonicalise`` undoes label
switching and sign symmetries in draws (the same table ``regenerate.py`` applies to
NUTS, ``CANONICALISE``); ``scores`` gives |z| of posterior means and sd ratios
against NUTS per coordinate.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

REFERENCES = Path(__file__).resolve().parent / "references"

# Per model: the steps that make every draw's labels (and signs) canonical.
# Each step is ``dict(op, key=(site, index), sites={site: axis})``: ``index`` picks,
# in one draw of ``site``, one value per component (shape ``(K,)``); ``sites`` maps
# each site to permute/flip to its component axis within one draw. ``op="sort"``
# reorders the components by increasing key; ``op="sign"`` multiplies the components
# whose key is negative by -1 (a symmetry such as tanh(-x) = -tanh(x)).
CANONICALISE = {
    "iris_mixture": [
        dict(op="sort", key=("locs", (slice(None), 0)), sites={"locs": 0, "prec": 0, "weights": 0})
    ],
    "poisson_mixture": [dict(op="sort", key=("rate", ()), sites={"rate": 0, "weights": 0})],
    # topic 1 of the simulation favours words 4-7: sorting by phi[:, 4] puts it last
    "lda": [dict(op="sort", key=("phi", (slice(None), 4)), sites={"phi": 0, "theta": 1})],
    # column 6 loads on the simulation's factor 1: sorting by V[6, :] puts it last
    "poisson_factorisation": [dict(op="sort", key=("V", (6, slice(None))), sites={"U": 1, "V": 1})],
    # hidden units are exchangeable and tanh is odd: make every output weight positive
    # (flipping the unit's input weights and bias), then sort the units
    "bnn_moons": [
        dict(op="sign", key=("w2", ()), sites={"w1": 1, "b1": 0, "w2": 0}),
        dict(op="sort", key=("w2", ()), sites={"w1": 1, "b1": 0, "w2": 0}),
    ],
}


def has_reference(name: str) -> bool:
    return (REFERENCES / f"{name}.json").exists()


def reference(name: str) -> dict:
    return json.loads((REFERENCES / f"{name}.json").read_text())


def _index_str(site, index):
    """'locs[:, 0]' for ("locs", (slice(None), 0)); 'rate' for ("rate", ())."""
    parts = [":" if i == slice(None) else str(i) for i in index]
    return f"{site}[{', '.join(parts)}]" if parts else site


def canonicalise(samples: dict, steps) -> tuple[dict, list[str]]:
    """Apply ``steps`` to every draw of ``samples`` (site -> ``(chains, draws, ...)``).

    Returns the new samples and a note per step."""
    out, notes = dict(samples), []
    for step in steps:
        key_site, index = step["key"]
        key = out[key_site][(slice(None), slice(None)) + tuple(index)]  # (chains, draws, K)
        for site, axis in step["sites"].items():
            x = np.moveaxis(out[site], 2 + axis, 2)  # component axis after (chains, draws)
            tail = (1,) * (x.ndim - 3)
            if step["op"] == "sort":
                order = np.argsort(key, axis=-1).reshape(key.shape + tail)
                x = np.take_along_axis(x, order, axis=2)
            elif step["op"] == "sign":
                x = x * np.where(key < 0, -1.0, 1.0).reshape(key.shape + tail)
            else:
                raise ValueError(f"unknown canonicalisation op {step['op']!r}")
            out[site] = np.moveaxis(x, 2, 2 + axis)
        what = "sorted by increasing" if step["op"] == "sort" else "sign-flipped where negative:"
        notes.append(
            f"in every draw, components {what} {_index_str(key_site, index)} "
            f"(applied to {', '.join(step['sites'])})"
        )
    return out, notes


def scores(name: str, draws: dict, ref: dict, exclude=(), only_missing=None):
    """``(|z|, sd ratio)`` per coordinate of the latent sites NUTS summarised.

    ``draws``: site -> ``(num_draws, ...)`` from q (canonicalised here like NUTS's).
    ``only_missing``: a boolean mask over a site's flattened elements that keeps the
    entries NUTS stored (``obs_mask`` models store the missing entries only).
    Entries whose NUTS sd is 0 (constants of the site's support) are left out.
    """
    draws = {k: np.asarray(v, float)[None] for k, v in draws.items()}
    if name in CANONICALISE:
        draws, _ = canonicalise(draws, CANONICALISE[name])
    zs, ratios = [], []
    for site, s in ref["nuts"]["sites"].items():
        if s.get("kind", "latent") != "latent" or site not in draws or site in exclude:
            continue
        x = draws[site][0]
        x = x.reshape(x.shape[0], -1)
        mean, sd = np.asarray(s["mean"], float), np.asarray(s["sd"], float)
        if x.shape[1] != mean.size and only_missing is not None:
            x = x[:, ~np.asarray(only_missing).reshape(-1)]
        # entries NUTS has constant (sd 0: an LKJ Cholesky factor's fixed 1 and 0s) are
        # not posterior uncertainty: there is nothing to score
        keep = sd != 0
        zs.append(np.abs(x.mean(0) - mean)[keep] / sd[keep])
        ratios.append(x.std(0)[keep] / sd[keep])
    return np.concatenate(zs), np.concatenate(ratios)
