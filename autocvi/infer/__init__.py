"""Layer 7, inference API: the loop, convergence, results, ``fit``."""

from .choose_beta import BetaChoice, beta_grid, choose_beta, predictive_log_loss
from .cvi import CVI, CVIRunResult, CVIRunState
from .fit import FitResult, IllConditionedError, fit
from .guide import CVIGuide
from .hyper import EMOptions
from .summary import print_summary

__all__ = [
    "FitResult",
    "fit",
    "IllConditionedError",
    "CVI",
    "CVIRunState",
    "CVIRunResult",
    "CVIGuide",
    "EMOptions",
    "print_summary",
    "BetaChoice",
    "beta_grid",
    "choose_beta",
    "predictive_log_loss",
]
