"""autocvi: conjugate-computation variational inference for NumPyro models.

graph = autocvi.trace(model, data)   # the factor graph autocvi sees
result = autocvi.fit(model, data)    # run CVI
"""

from .graph import EdgeInfo, FactorGraph, FactorNode, ParamNode, PlateInfo, VariableNode
from .tracing import ModelError, trace

__all__ = [
    "trace",
    "ModelError",
    "FactorGraph",
    "VariableNode",
    "FactorNode",
    "ParamNode",
    "PlateInfo",
    "EdgeInfo",
]
__version__ = "0.1.0"
