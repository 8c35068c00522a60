"""Discrete latents the model asks to have enumerated, which autocvi does not enumerate.

NumPyro users mark a discrete site for exact summation with ``infer={"enumerate":
"parallel"}`` (or ``config_enumerate``); ``TraceEnum_ELBO`` then sums it out. autocvi
keeps such a site as a latent of its own: q(z) is a Categorical (or Bernoulli) per element,
independent of the other latents, updated by exact variational message passing. Where
the assignments are uncertain (overlapping mixture components) that independence narrows
q of the other latents; the after-fit importance check reads q against the posterior
with z summed out and warns when it does (:mod:`autocvi.infer.importance`). ``plan()``
says so up front.
"""

from __future__ import annotations

from ..model.graph import FactorGraph


def find_enumerated(graph: FactorGraph) -> tuple[str, ...]:
    """The latent sites whose ``infer`` dict asks for enumeration, in model order."""
    names = [n for n, v in graph.variables.items() if v.discrete and not v.observed]
    if not names:  # no model run needed to read the sites' infer dicts
        return ()
    return tuple(
        n
        for n in names
        if ((graph.example_trace_site(n).get("infer") or {}).get("enumerate") is not None)
    )


def describe_enumerated(names: tuple[str, ...]) -> str:
    """The line ``plan()`` prints about them."""
    sites = ", ".join(map(repr, names))
    return (
        f"{sites}: marked for enumeration (infer={{'enumerate': ...}}, as config_enumerate "
        "sets), which autocvi does not do: q keeps a Categorical per element, independent of "
        "the other latents (exact variational message passing). The after-fit importance "
        "check reads q against the posterior with them summed out and warns where that "
        "independence narrows q; for q over that marginal posterior, write them summed out "
        "(MixtureSameFamily, or a logsumexp over their values in a numpyro.factor)"
    )
