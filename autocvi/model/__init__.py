"""Layer 2, the model: trace a NumPyro program into a FactorGraph (plain data, no inference)."""

from .graph import EdgeInfo, FactorGraph, FactorNode, ParamNode, PlateInfo, VariableNode
from .trace import ModelError, trace_model

__all__ = [
    "EdgeInfo",
    "FactorGraph",
    "FactorNode",
    "ModelError",
    "ParamNode",
    "PlateInfo",
    "VariableNode",
    "trace_model",
]
