"""Attach variational families and conjugacy verdicts to a traced FactorGraph.

For every latent the family comes from its prior (:mod:`autocvi.layout`);
for every (factor, latent) edge the verdict comes from the abstract
interpretation in :mod:`autocvi.conjugacy`, plus one registry fact the
interpretation need not rediscover: a site's own prior density is conjugate to
the family chosen from that prior.
"""

from __future__ import annotations

from ..model.graph import EdgeInfo, FactorGraph
from ..model.trace import trace_model
from .conjugacy import classify_edge
from .layout import LatentLayout, make_layout

__all__ = ["classify_graph", "latent_layouts", "trace"]


def latent_layouts(graph: FactorGraph) -> dict[str, LatentLayout]:
    """The :class:`LatentLayout` of every latent site, in model order."""
    layouts = {}
    for name in graph.latent_names:
        var = graph.variables[name]
        prior, value = graph.example_site(name)
        plate_axes = {len(var.batch_shape) + p.dim for p in var.plates}
        own = graph.factors[name]
        # Data read through params are constants of the prior (autocvi.CVI's inputs).
        constant = own.latents == (name,) and all(graph.params[p].data for p in own.params)
        layouts[name] = make_layout(name, prior, value, var.batch_shape, plate_axes, constant)
    return layouts


def classify_graph(graph: FactorGraph) -> FactorGraph:
    """A copy of ``graph`` with families on latents and verdicts on every edge."""
    layouts = latent_layouts(graph)
    graph = graph.with_families({n: lay.family for n, lay in layouts.items()})
    values = graph.example_values
    edges = {}
    for factor in graph.factors.values():
        site_fn = graph.site_fn(factor.name)
        for latent in factor.latents:
            family = layouts[latent].family
            if family == "Joint":  # a joint group's coordinates: one Gaussian vector
                family = layouts[latent].q_family
            if factor.site == latent and family != "Unconstrained":
                edges[(factor.name, latent)] = EdgeInfo(
                    conjugate=True,
                    reason=f"the prior of {latent} is in its variational family ({family}).",
                    statistics=(),
                )
                continue
            verdict = classify_edge(site_fn, values, latent, family, site_name=factor.name)
            edges[(factor.name, latent)] = EdgeInfo(
                conjugate=bool(verdict.conjugate),
                reason=verdict.reason,
                statistics=tuple(verdict.statistics),
            )
    return graph.with_edges(edges)


def trace(model, data=None, *, classify: bool = True, rng_key=0, init_strategy=None) -> FactorGraph:
    """Trace ``model(**data)`` into the factor graph autocvi sees, classified.

    Args:
        model: a NumPyro model function.
        data: keyword arguments for the model (the NumPyro idiom
            ``def model(X, y=None)``), observations included.
        classify: also decide every latent's variational family and every
            factor-latent edge's conjugacy verdict (``autocvi.analysis.conjugacy``).
        rng_key: seed for the one model run that draws example latent values
            (and the indices of subsampled plates).
        init_strategy: a NumPyro ``init_to_*`` strategy for the latents'
            example and starting values (default ``init_to_sample``; sites
            without ``sample``, such as ``ImproperUniform``, use ``init_to_uniform``).

    Returns:
        a :class:`~autocvi.model.graph.FactorGraph`; see
        :func:`autocvi.model.trace.trace_model` for what it holds and raises.
    """
    graph = trace_model(model, data, rng_key=rng_key, init_strategy=init_strategy)
    return classify_graph(graph) if classify else graph
