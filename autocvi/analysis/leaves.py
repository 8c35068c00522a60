"""Latents nothing else reads: held at their prior conditional, exactly.

A latent site whose own density is the only factor that reads it (NumPyro's
``obs_mask`` imputation ``y_unobserved`` when the model does not use the filled-in
``y``; a draw kept only for a ``numpyro.deterministic``) says nothing about the
other latents. The posterior factorises as

    p(x_rest, x_leaf | data) = p(x_rest | data) p(x_leaf | x_rest),

so the best q of the leaf given the rest is its prior conditional, and holding it
there loses nothing: ``E_q[log p(x_leaf | x_rest) - log q(x_leaf | x_rest)] = 0``, and
the ELBO is that of ``q(x_rest)`` on the model without the leaf (the same bound on
the evidence). The planner fits the model with every leaf held out of the trace
(:func:`hold_sites`), and ``FitResult.sample`` (or ``Predictive`` with the fit's
guide) draws each leaf from the model given each draw of the rest.

A q of its own is worse whenever the conditional is outside q's family: a Gaussian
q of a Student-t imputation had 0.72-0.87 of NUTS's sd at the missing responses
(``tests/test_leaves.py``), and mean-field with its parents it drops their
uncertainty from its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import numpyro

from ..model.graph import FactorGraph

__all__ = ["find_leaves", "hold_sites", "describe_leaves"]


def find_leaves(graph: FactorGraph) -> tuple[str, ...]:
    """The latents of ``graph`` read by no factor but their own density, in model order.

    Not under a subsampled plate (their draws would exist per minibatch only), and ()
    when every latent is one (a model with nothing to fit is left as it is).
    """
    leaves = tuple(
        name
        for name in graph.latent_names
        if graph.factors_of(name) == (name,)
        and not any(p.subsampled for p in graph.variables[name].plates)
    )
    return leaves if len(leaves) < len(graph.latent_names) else ()


class _Held(numpyro.primitives.Messenger):
    """Gives the named sample sites a fixed value and hides them from every outer
    handler (as ``numpyro.handlers.block`` does): no trace records them, no q for them."""

    def __init__(self, values: Mapping):
        self.values = values
        super().__init__()

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] in self.values:
            msg["value"] = self.values[msg["name"]]
            msg["stop"] = True


def hold_sites(model: Callable, values: Mapping) -> Callable:
    """``model`` with the sites in ``values`` held at those values and out of its trace.

    The values only stand in for what the model computes from the sites (its return
    value, ``numpyro.deterministic`` sites): the held sites have no density in the
    held model.
    """

    @functools.wraps(model)
    def held(*args, **kwargs):
        with _Held(values):
            return model(*args, **kwargs)

    return held


def describe_leaves(leaves: tuple[str, ...]) -> str:
    """The line ``plan()`` prints about the held sites."""
    names = ", ".join(map(repr, leaves))
    return (
        f"{names}: read by no factor but {'its' if len(leaves) == 1 else 'their'} own "
        "density, so q holds each at its prior conditional given the rest (exact; not a "
        "node of the schedule): FitResult.sample draws them from the model given the "
        "other latents' draws"
    )
