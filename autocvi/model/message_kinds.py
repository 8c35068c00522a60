"""The message kinds: one registry entry each (the CVI paper's messages, Alg. 2, App. B.1, F).

A kind says when it applies (its docstring), whether it is deterministic, its
default step size beta, and its colour in DOT renderings. The engine
(:mod:`autocvi.engine.step`) registers how each kind is computed and refuses to
build a step for a registry it does not fully implement; ``tests/test_registries.py``
checks both sides. Adding a kind is one entry here plus one function there.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "MessageKind",
    "EXACT",
    "GAUSS_HERMITE",
    "CUBATURE",
    "MONTE_CARLO",
    "FISHER",
    "MESSAGE_KINDS",
]


@dataclass(frozen=True)
class MessageKind:
    """One kind of CVI message ``g_{a,i} = grad_{mu_i} E_q[log p_a]``."""

    name: str
    applies_when: str
    deterministic: bool
    # beta when a node's messages are all of this kind or more stable ones; a
    # node with several kinds uses the smallest.
    default_step: float
    colour: str


EXACT = MessageKind(
    "exact",
    "the factor is conjugate to the node: the exact VMP message E_{q/i}[eta_{a,i}]",
    True,
    1.0,
    "forestgreen",
)
GAUSS_HERMITE = MessageKind(
    "gauss-hermite",
    "Gaussian node seen through a scalar linear predictor per element: 1-D quadrature "
    "(CVI App. B.1: dE/dm = E[f'], dE/dv = E[f'']/2)",
    True,
    0.5,
    "royalblue",
)
CUBATURE = MessageKind(
    "cubature",
    "Gaussian node seen through a K-vector linear predictor per element (a softmax's logits): "
    "E[grad f], E[hess f]/2 per element by the K-dim spherical-radial cubature rule (CVI "
    "App. B.1 with K x K blocks)",
    True,
    0.5,
    "teal",
)
MONTE_CARLO = MessageKind(
    "monte-carlo",
    "Gaussian node, any other non-conjugate factor: Bonnet/Price estimates E[grad f], E[hess f]/2",
    False,
    0.5,
    "darkorange",
)
FISHER = MessageKind(
    "fisher",
    "other exponential-family node, non-conjugate factor: the reparameterised gradient in natural "
    "parameters times the inverse Fisher matrix (CVI App. F)",
    False,
    0.1,
    "purple",
)

MESSAGE_KINDS: dict[str, MessageKind] = {
    k.name: k for k in (EXACT, GAUSS_HERMITE, CUBATURE, MONTE_CARLO, FISHER)
}
