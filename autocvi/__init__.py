"""autocvi: conjugate-computation variational inference for NumPyro models.

graph = autocvi.trace(model, data)   # the factor graph autocvi sees
result = autocvi.fit(model, data)    # run CVI
"""

from .engine import CVIInfo, CVIState, cvi
from .fit import FitResult, fit
from .graph import EdgeInfo, FactorGraph, FactorNode, ParamNode, PlateInfo, VariableNode
from .schedule import Schedule, plan
from .tracing import ModelError, trace

__all__ = [
    "trace",
    "plan",
    "fit",
    "cvi",
    "FitResult",
    "Schedule",
    "CVIState",
    "CVIInfo",
    "ModelError",
    "FactorGraph",
    "VariableNode",
    "FactorNode",
    "ParamNode",
    "PlateInfo",
    "EdgeInfo",
]
__version__ = "0.1.0"
