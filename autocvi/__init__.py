"""autocvi: conjugate-computation variational inference for NumPyro models.

graph = autocvi.trace(model, data)   # the factor graph autocvi sees
result = autocvi.fit(model, data)    # run CVI

Layers (each imports only from the ones before it; ``tests/test_layers.py``):
``families`` -> ``model`` -> ``analysis`` -> ``blocks`` -> ``plan`` -> ``engine`` -> ``infer``.
"""

from . import datasets
from .analysis import trace
from .engine import CVIInfo, CVIState, cvi
from .infer import (
    CVI,
    CVIGuide,
    CVIRunResult,
    CVIRunState,
    FitResult,
    IllConditionedError,
    fit,
    print_summary,
)
from .model import (
    EdgeInfo,
    FactorGraph,
    FactorNode,
    ModelError,
    ParamNode,
    PlateInfo,
    VariableNode,
)
from .plan import Schedule, plan

__all__ = [
    "datasets",
    "trace",
    "plan",
    "fit",
    "cvi",
    "CVI",
    "CVIRunState",
    "CVIRunResult",
    "CVIGuide",
    "print_summary",
    "FitResult",
    "IllConditionedError",
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
