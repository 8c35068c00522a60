"""Layer 7, inference API: the loop, convergence, results, ``fit``."""

from .fit import FitResult, fit

__all__ = ["FitResult", "fit"]
