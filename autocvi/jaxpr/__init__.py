"""Reading jaxprs: the one walker shared by the model, analysis and plan layers;
compiling programs once per structure (:mod:`autocvi.jaxpr.compile`)."""

from .compile import (
    clear_program_cache,
    enable_compilation_cache,
    program_cache_info,
    structural_jit,
)
from .walk import (
    CALL_BODY,
    CUSTOM_DERIVATIVE,
    PLAIN_CALLS,
    DropVar,
    Literal,
    bind,
    call_body,
    closed_parts,
    dce,
    has_sub_jaxpr,
    interpret,
    used_inputs,
)

__all__ = [
    "clear_program_cache",
    "enable_compilation_cache",
    "program_cache_info",
    "structural_jit",
    "CALL_BODY",
    "CUSTOM_DERIVATIVE",
    "PLAIN_CALLS",
    "DropVar",
    "Literal",
    "bind",
    "call_body",
    "closed_parts",
    "dce",
    "has_sub_jaxpr",
    "interpret",
    "used_inputs",
]
