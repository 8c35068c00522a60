"""Layer 7, inference API: the loop, convergence, results, ``fit``."""

from .choose_beta import BetaChoice, beta_grid, choose_beta, predictive_log_loss
from .convergence import Diagnostics, FitWarning
from .cvi import CVI, CVIRunResult, CVIRunState
from .fit import FitResult, IllConditionedError, fit
from .guide import CVIGuide
from .hyper import EMOptions
from .importance import ImportanceCheck
from .summary import print_summary

__all__ = [
    "FitResult",
    "fit",
    "IllConditionedError",
    "FitWarning",
    "Diagnostics",
    "ImportanceCheck",
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
