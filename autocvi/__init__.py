"""autocvi: conjugate-computation variational inference for NumPyro models.

graph = autocvi.trace(model, data)   # the factor graph autocvi sees
result = autocvi.fit(model, data)    # run CVI
autocvi.classify_edge(site_fn, values, target, family)   # one conjugacy verdict (docs/conjugacy.md)

Layers (each imports only from the ones before it; ``tests/test_layers.py``):
``families`` -> ``datasets`` -> ``jaxpr`` -> ``model`` -> ``analysis`` -> ``blocks`` -> ``plan`` -> ``engine`` -> ``infer``.
"""

from . import datasets
from .analysis import trace
from .analysis.conjugacy import EdgeVerdict, classify_edge
from .analysis.objectives import DLM, ELBO, BetaELBO, Objective
from .analysis.unrolled import PerformanceWarning
from .blocks import BlockPosterior
from .engine import CVIInfo, CVIState, cvi
from .infer import (
    CVI,
    BetaChoice,
    CVIGuide,
    CVIRunResult,
    CVIRunState,
    Diagnostics,
    EMOptions,
    FitResult,
    FitWarning,
    IllConditionedError,
    ImportanceCheck,
    beta_grid,
    choose_beta,
    fit,
    predictive_log_loss,
    print_summary,
)
from .jaxpr import enable_compilation_cache, program_cache_info
from .model import (
    EdgeInfo,
    FactorGraph,
    FactorNode,
    ModelError,
    ParamNode,
    PlateInfo,
    VariableNode,
)
from .plan import PLANNER_OPTIONS, Schedule, plan

__all__ = [
    "datasets",
    "trace",
    "plan",
    "PLANNER_OPTIONS",
    "fit",
    "cvi",
    "CVI",
    "CVIRunState",
    "CVIRunResult",
    "CVIGuide",
    "EMOptions",
    "ELBO",
    "BetaELBO",
    "DLM",
    "Objective",
    "choose_beta",
    "beta_grid",
    "BetaChoice",
    "predictive_log_loss",
    "print_summary",
    "enable_compilation_cache",
    "program_cache_info",
    "FitResult",
    "IllConditionedError",
    "FitWarning",
    "PerformanceWarning",
    "Diagnostics",
    "ImportanceCheck",
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
    "EdgeVerdict",
    "classify_edge",
    "BlockPosterior",
]
__version__ = "0.1.0"
