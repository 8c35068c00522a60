"""Layer 6, the engine: ``init`` and a pure, jit-able ``step`` for a schedule (CVI, Alg. 2)."""

from .step import CVIAlgorithm, CVIInfo, CVIState, cvi

__all__ = ["CVIAlgorithm", "CVIInfo", "CVIState", "cvi"]
