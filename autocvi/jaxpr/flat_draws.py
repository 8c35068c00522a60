"""Random bits drawn flat: the same numbers, a fraction of the compilation.

``jax.random.normal(key, (32, 10))`` and ``jax.random.normal(key, (320,)).reshape(32, 10)``
give the same numbers bit for bit (threefry's counter for an element is its position in
the flattened array, with ``jax_threefry_partitionable`` on or off), but XLA's CPU
compiler at its default optimisation takes about four times as long over the first:
0.60 against 0.15 s on this project's 2-core CPU for one (32, 10) draw (jax 0.9), whose
two-dimensional counters it lowers to much more code. A CVI step draws several such
arrays (a joint Gaussian's Monte Carlo draws for its message, its line search and its
ELBO), and its compilation is most of what a user waits for on a first fit.

:func:`evaluate` evaluates a jaxpr as ``jax.core.eval_jaxpr`` does, with every
``random_bits`` of a threefry key over a shape of two or more axes drawn flat and
reshaped, inside the calls, scans, loops and conditionals that hold one. A jaxpr without
such a draw is evaluated as it is (:func:`has_shaped_draws` says which). Custom-derivative
calls are left whole (their rule must survive a caller's differentiation), so a draw inside
one keeps its shape: slower to compile, never different.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

from . import walk

__all__ = ["evaluate", "has_shaped_draws"]

_RANDOM_BITS = "random_bits"
# Primitives whose sub-jaxprs are rewritten in place (same signature, same values).
_CONTROL_FLOW = frozenset({"scan", "while", "cond"})
_FLATTENED_IMPLS = frozenset({"threefry2x32"})


def _is_shaped_draw(eqn) -> bool:
    if eqn.primitive.name != _RANDOM_BITS or len(eqn.params.get("shape", ())) < 2:
        return False
    impl = getattr(getattr(eqn.invars[0].aval, "dtype", None), "_impl", None)
    return getattr(impl, "name", None) in _FLATTENED_IMPLS


def _sub_jaxprs(eqn) -> list:
    out = []
    for value in eqn.params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, (jcore.Jaxpr, jcore.ClosedJaxpr)):
                out.append(walk.closed_parts(v)[0])
    return out


def has_shaped_draws(jaxpr) -> bool:
    """Whether ``jaxpr`` (or a sub-jaxpr that :func:`evaluate` rewrites) draws random
    bits of a threefry key over two or more axes."""
    return _has_shaped_draws(jaxpr, {})


def _has_shaped_draws(jaxpr, memo: dict) -> bool:
    if id(jaxpr) in memo:
        return memo[id(jaxpr)]
    found = False
    for eqn in jaxpr.eqns:
        if _is_shaped_draw(eqn) or (_rewritable(eqn) and _inner(eqn, memo)):
            found = True
            break
    memo[id(jaxpr)] = found
    return found


def _inner(eqn, memo) -> bool:
    return any(_has_shaped_draws(j, memo) for j in _sub_jaxprs(eqn))


def _rewritable(eqn) -> bool:
    return eqn.primitive.name in walk.PLAIN_CALLS or eqn.primitive.name in _CONTROL_FLOW


def evaluate(jaxpr, consts, args) -> list:
    """``jax.core.eval_jaxpr(jaxpr, consts, *args)`` with shaped threefry draws made flat."""
    memo: dict = {}
    if not _has_shaped_draws(jaxpr, memo):
        return jcore.jaxpr_as_fun(jcore.ClosedJaxpr(jaxpr, consts))(*args)
    return _evaluate(jaxpr, consts, args, memo)


def _evaluate(jaxpr, consts, args, memo) -> list:
    def eval_eqn(eqn, ins):
        if _is_shaped_draw(eqn):
            shape = tuple(eqn.params["shape"])
            params = {**eqn.params, "shape": (math.prod(shape),)}
            flat = eqn.primitive.bind(*ins, **params)
            return [jnp.reshape(flat, eqn.outvars[0].aval.shape)]
        if not (_rewritable(eqn) and _inner(eqn, memo)):
            return walk.bind(eqn, ins)
        if eqn.primitive.name in walk.PLAIN_CALLS:
            body = walk.call_body(eqn)
            if body is not None:  # a plain call: its body inlined, same values
                return _evaluate(*body, ins, memo)
            return walk.bind(eqn, ins)
        params = {k: _rewrite_param(v, memo) for k, v in eqn.params.items()}
        return walk.bind(eqn.replace(params=params), ins)

    return walk.interpret(jaxpr, consts, args, eval_eqn, enter=())


def _rewrite_param(value: Any, memo) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(_rewrite_param(v, memo) for v in value)
    if not isinstance(value, jcore.ClosedJaxpr) or not _has_shaped_draws(value.jaxpr, memo):
        return value
    inner, consts = value.jaxpr, list(value.consts)
    specs = [_spec(v.aval) for v in inner.invars]
    new = jax.make_jaxpr(lambda *a: _evaluate(inner, consts, a, memo))(*specs)
    if new.out_avals != value.out_avals or new.consts:  # pragma: no cover - a convention not met
        return value
    return new


def _spec(aval):
    # weak types kept: a loop's carry must come out of the body as it went in
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False))
