"""Exact expected log factors for conjugate factors (the VMP building block).

``expected_log_factor(graph, factor)`` returns ``E_q[log p_a]`` as a JAX
function of the mean parameters of the factor's latent neighbours. When every
edge of the factor is conjugate, the factor is multi-affine in the
neighbours' sufficient statistics, so the expectation is exact (tensor product
of moment-matched nodes, DESIGN.md section 5) and its gradient w.r.t. one
neighbour's mean parameters is that neighbour's VMP message (CVI paper,
Sec. 5: ``g_{a,i} = grad_{mu_i} E_q[log p_a]``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from ..analysis.classify import latent_layouts
from ..analysis.expectations import alignment, expect, moment_point_set
from ..model.graph import FactorGraph
from ..plan.schedule import _compiled_log_density, _plate_examples

__all__ = ["expected_log_factor", "vmp_message"]


def expected_log_factor(graph: FactorGraph, factor: str) -> Callable:
    """``f(mean_params) -> E_q[log p_factor]`` (a scalar, summed over plate elements).

    Args:
        graph: a classified FactorGraph (``autocvi.trace``).
        factor: the factor's name.

    Returns:
        a pure JAX function of ``{latent: mu}`` for the factor's latent
        neighbours, where ``mu`` is the mean-parameter tuple of the latent's
        family (layouts in ``docs/internals.md``).

    Raises:
        ValueError: when an edge of the factor is not conjugate (then no exact
            expectation exists; the engine estimates it instead).
    """
    fac = graph.factors[factor]
    bad = [lat for lat in fac.latents if not graph.is_conjugate(factor, lat)]
    if bad:
        raise ValueError(
            f"factor {factor!r} is not conjugate in {', '.join(bad)}: its expectation has no "
            f"closed form (see graph.explain({factor!r}, {bad[0]!r}))."
        )
    layouts = latent_layouts(graph)
    values = graph.example_values
    example = {**values, **_plate_examples(graph)}
    log_density = _compiled_log_density(graph.log_density_fn(factor), example)
    factor_ndim = len(jax.eval_shape(log_density, example).shape)
    aligns = {
        lat: alignment(
            layouts[lat],
            graph.variables[lat].plates,
            len(graph.variables[lat].batch_shape),
            fac.plates,
            factor_ndim,
        )
        for lat in fac.latents
    }
    fixed = {k: v for k, v in example.items() if k not in fac.latents}

    def expected(mean_params: dict):
        sets = {
            lat: moment_point_set(layouts[lat], mean_params[lat], aligns[lat])
            for lat in fac.latents
        }
        return expect(log_density, sets, fixed)

    return expected


def vmp_message(graph: FactorGraph, factor: str, latent: str) -> Callable:
    """``f(mean_params) -> natural-parameter message`` from ``factor`` to ``latent``."""
    expected = expected_log_factor(graph, factor)

    def message(mean_params: dict):
        def of_latent(mu):
            return expected({**mean_params, latent: mu})

        return jax.grad(of_latent)(mean_params[latent])

    return message
