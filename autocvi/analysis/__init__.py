"""Layer 3, analysis: what each factor is as a function of each latent.

Variational families per latent (:mod:`.layout`), conjugacy verdicts per edge
(:mod:`.conjugacy`), the linear-predictor split (:mod:`.linear_predictor`) and
the expectations under moment nodes (:mod:`.expectations`).
"""

from .classify import classify_graph, latent_layouts, trace

__all__ = ["classify_graph", "latent_layouts", "trace"]
