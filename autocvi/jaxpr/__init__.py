"""Reading jaxprs: the one walker shared by the model, analysis and plan layers;
compiling programs once per structure (:mod:`autocvi.jaxpr.compile`)."""

from . import compile as _compile
from . import walk as _walk
from .compile import *  # noqa: F403 - the package is its two modules' public names
from .walk import *  # noqa: F403
from .walk import CUSTOM_DERIVATIVE, PLAIN_CALLS  # noqa: F401 - used by the analysis layer

__all__ = [*_compile.__all__, *_walk.__all__, "CUSTOM_DERIVATIVE", "PLAIN_CALLS"]
