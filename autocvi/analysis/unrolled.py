"""Sample sites written one at a time in a Python loop: found, and the user told at once.

A state-space model written as NumPyro's tutorials first write it,

    for t in range(1, T):
        x = numpyro.sample(f"x_{t}", dist.Normal(phi * x, sigma))
        numpyro.sample(f"y_{t}", dist.Normal(x, 0.5), obs=y[t])

has ``T`` latent sites and ``T`` likelihood factors. autocvi gives each site and each
factor its own message, so the compiled step grows with ``T``: an AR(1) of T = 100 written
this way took 481 s to fit, the same model with ``numpyro.contrib.control_flow.scan``
10.6 s, with the same posterior. Nothing is wrong with the answer, so this is a
:class:`PerformanceWarning` (issued by :func:`autocvi.plan`, before anything is compiled,
and shown in the plan's notes), naming the sites and the rewrite.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..model.graph import FactorGraph

__all__ = ["PerformanceWarning", "UnrolledSites", "find_unrolled", "describe_unrolled"]

# Sites named alike (the same name but for one integer) from which a loop is reported.
MIN_SITES = 20

# A site's name with its last integer taken out: "x_12" -> ("x_", "") ; "y[3]" -> ("y[", "]").
_LAST_INTEGER = re.compile(r"^(.*\D)?(\d+)(\D*)$")


class PerformanceWarning(UserWarning):
    """The model is written in a way that makes autocvi slow (the answer is not affected);
    the message names the sites and the faster way to write them."""


@dataclass(frozen=True)
class UnrolledSites:
    """Sites named alike, one per integer (``x_0 ... x_99``), with the same distribution
    and shape: the sites of a Python loop."""

    pattern: str  # the name with the integer as "{i}", e.g. "x_{i}"
    names: tuple[str, ...]
    distribution: str
    shape: tuple[int, ...]
    observed: bool

    def describe(self) -> str:
        kind = "observed" if self.observed else "latent"
        return (
            f"{self.names[0]} ... {self.names[-1]}: {len(self.names)} {kind} "
            f"{self.distribution} sites of shape {self.shape}"
        )


def find_unrolled(graph: FactorGraph, min_sites: int = MIN_SITES) -> tuple[UnrolledSites, ...]:
    """Groups of at least ``min_sites`` sites of ``graph`` whose names differ only in one
    integer and whose distribution and shape agree, in model order (latents first)."""
    groups: dict[tuple, list[tuple[int, str]]] = {}
    for name, v in graph.variables.items():
        m = _LAST_INTEGER.match(name)
        if m is None:
            continue
        key = (m.group(1) or "", m.group(3), v.distribution, tuple(v.shape), v.observed)
        groups.setdefault(key, []).append((int(m.group(2)), name))
    found = [
        UnrolledSites(
            f"{head}{{i}}{tail}",
            tuple(n for _, n in sorted(members)),
            distribution,
            shape,
            observed,
        )
        for (head, tail, distribution, shape, observed), members in groups.items()
        if len(members) >= min_sites
    ]
    return tuple(sorted(found, key=lambda u: u.observed))


def describe_unrolled(found: tuple[UnrolledSites, ...]) -> str:
    """The warning and plan note for :func:`find_unrolled`'s groups."""
    sites = "; ".join(u.describe() for u in found)
    return (
        f"sites written one at a time (a Python loop?): {sites}. autocvi gives every site "
        "and factor its own message, so the compiled step grows with the loop's length "
        "(an AR(1) of 100 steps: 481 s to fit, 10.6 s written with scan; the posterior "
        "is the same). Write the loop with numpyro.contrib.control_flow.scan, or "
        "vectorise it under a numpyro.plate, to get one site and one factor for all of them."
    )
