"""One jaxpr walker for every analysis of a model's log densities.

Three passes read the jaxprs of a model's log densities: the dependency pass
(which latents each factor reads, :mod:`autocvi.model.trace`), the conjugacy
interpreter (:mod:`autocvi.analysis.conjugacy.interpreter`) and the
linear-predictor split (:mod:`autocvi.analysis.linear_predictor`); the planner
replays each factor's dead-code-eliminated jaxpr (:mod:`autocvi.plan.schedule`).
They share this module's

* table of call-like primitives and where each keeps its body (:data:`CALL_BODY`),
  and :func:`call_body` to open one;
* environment walk (:func:`interpret`): constants, literals, dropped outputs,
  and entering calls, with the per-equation work supplied by the caller;
* dead-code elimination (:func:`dce`, :func:`used_inputs`) -- the only use of
  JAX's private ``partial_eval`` module in the package, so that when it moves
  one place changes;
* :func:`bind`, evaluating one equation as ``jax.core.eval_jaxpr`` does.

Nothing here catches an exception it cannot name: a failure of JAX's own DCE
rule propagates, except the documented absence of the private module (then
every input counts as used, which is conservative, never wrong).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from jax.extend import core as jcore

try:  # JAX's dead-code elimination is private; one import site for the package
    from jax._src.interpreters import partial_eval as _pe
except ImportError:  # pragma: no cover - the private module moved
    _pe = None

__all__ = [
    "CALL_BODY",
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

Literal = jcore.Literal
# jax.extend.core exports DropVar from jax 0.10; older releases keep it in jax's core module.
DropVar = getattr(jcore, "DropVar", None)
if DropVar is None:  # pragma: no cover - jax < 0.10
    from jax._src.core import DropVar

# Call-like primitives whose output is their body's output on the same inputs, and the
# parameter that holds the body (custom_vjp_call keeps it under "fun_jaxpr" in some
# jax releases: `call_body` tries both).
CALL_BODY: dict[str, str] = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat": "jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    # ``jnp.linalg.solve``: its value is its ``solve`` jaxpr applied to the solve's
    # constants and the right-hand side (:func:`_linear_solve_body`).
    "custom_linear_solve": "jaxprs",
}
# Custom-derivative calls: same value as their body, but their own JVP/VJP rule.
CUSTOM_DERIVATIVE = frozenset(
    {"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_linear_solve"}
)
# Calls whose body can be inlined without changing values or derivatives.
PLAIN_CALLS = frozenset(CALL_BODY) - CUSTOM_DERIVATIVE


def closed_parts(j) -> tuple[Any, list]:
    """``(jaxpr, consts)`` of a ``ClosedJaxpr`` or a bare ``Jaxpr``."""
    if hasattr(j, "jaxpr") and hasattr(j, "consts"):
        return j.jaxpr, list(j.consts)
    return j, []


def call_body(eqn) -> tuple[Any, list] | None:
    """The body ``(jaxpr, consts)`` of a call-like equation, or None for any other."""
    key = CALL_BODY.get(eqn.primitive.name)
    if key is None:
        return None
    if eqn.primitive.name == "custom_linear_solve":
        return _linear_solve_body(eqn)
    body = eqn.params.get(key)
    if body is None:
        body = eqn.params.get("fun_jaxpr", eqn.params.get("call_jaxpr"))
    if body is None:
        return None
    jaxpr, consts = closed_parts(body)
    if len(jaxpr.constvars) != len(consts) or len(jaxpr.invars) != len(eqn.invars):
        return None  # a calling convention this walker does not know: treat as opaque
    return jaxpr, consts


# Bodies built for custom_linear_solve equations (keyed by the solve jaxpr and avals).
_SOLVE_BODIES: dict = {}


def _linear_solve_body(eqn) -> tuple[Any, list] | None:
    """A body with the equation's inputs whose value is ``custom_linear_solve``'s.

    The equation's inputs are the constants of (matvec, vecmat, solve,
    transpose_solve), then the right-hand side; its value is the ``solve``
    jaxpr on (solve constants, right-hand side). So ``jnp.linalg.solve(K, u)``
    is seen as the LU solve it runs: linear in ``u`` for a constant ``K``.
    """
    lengths, solve = eqn.params.get("const_lengths"), getattr(eqn.params["jaxprs"], "solve", None)
    if lengths is None or solve is None:
        return None
    start = lengths.matvec + lengths.vecmat
    picked = [*range(start, start + lengths.solve), *range(sum(lengths), len(eqn.invars))]
    avals = tuple((tuple(v.aval.shape), str(v.aval.dtype)) for v in eqn.invars)
    key = (id(solve), avals)
    if key not in _SOLVE_BODIES:
        import jax

        inner, inner_consts = closed_parts(solve)

        def value(*ins):
            return jax.core.eval_jaxpr(inner, inner_consts, *(ins[i] for i in picked))

        specs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
        closed = jax.make_jaxpr(value)(*specs)
        if len(_SOLVE_BODIES) > 256:
            _SOLVE_BODIES.clear()
        _SOLVE_BODIES[key] = (solve, closed_parts(closed))  # holds solve: its id stays unique
    return _SOLVE_BODIES[key][1]


def has_sub_jaxpr(eqn) -> bool:
    """Whether the equation carries a sub-jaxpr (calls, scan, cond, while, ...)."""

    def is_jaxpr(x) -> bool:
        return isinstance(x, (jcore.Jaxpr, jcore.ClosedJaxpr))

    return any(
        is_jaxpr(v) or (isinstance(v, (tuple, list)) and any(is_jaxpr(x) for x in v))
        for v in eqn.params.values()
    )


def interpret(
    jaxpr,
    consts,
    args,
    eval_eqn: Callable[[Any, list], list],
    *,
    literal: Callable[[Any], Any] = lambda lit: lit.val,
    const: Callable[[Any, Any], Any] = lambda var, c: c,
    enter: Collection[str] = frozenset(CALL_BODY),
) -> list:
    """Walk ``jaxpr`` in order; ``eval_eqn(eqn, inputs) -> outputs`` does the work.

    Inputs and outputs are whatever the caller's domain is (arrays, bitmasks,
    abstract values, graph node ids); ``literal(lit)`` and ``const(var, value)``
    map the jaxpr's literals and constants into it. Calls named in ``enter`` are walked into with
    the same ``eval_eqn`` instead of being handed to it; outputs bound to a
    dropped variable are discarded.
    """
    env: dict = {}

    def read(v):
        return literal(v) if isinstance(v, Literal) else env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = const(v, c)
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        body = call_body(eqn) if eqn.primitive.name in enter else None
        if body is not None:
            outs = interpret(*body, ins, eval_eqn, literal=literal, const=const, enter=enter)
        else:
            outs = eval_eqn(eqn, ins)
        for v, o in zip(eqn.outvars, outs):
            if not isinstance(v, DropVar):
                env[v] = o
    return [read(v) for v in jaxpr.outvars]


def bind(eqn, args) -> list:
    """Evaluate one equation on concrete arguments; always a list of outputs."""
    bp = eqn.primitive.get_bind_params(eqn.params)
    if isinstance(bp, tuple):  # older jax: (subfuns, params)
        subfuns, params = bp
        out = eqn.primitive.bind(*subfuns, *args, **params)
    else:
        out = eqn.primitive.bind(*args, **bp)
    return list(out) if eqn.primitive.multiple_results else [out]


def dce(jaxpr, *, keep_inputs: bool = False) -> tuple[Any, list[bool]]:
    """Dead-code-eliminate ``jaxpr``: ``(pruned jaxpr, which inputs it still reads)``.

    Every output is kept. The pruned jaxpr has only the inputs marked used, or all
    of them with ``keep_inputs`` (so that callers can pass the same arguments).
    Without JAX's private DCE the jaxpr is returned whole with every input used.
    """
    if _pe is None:  # pragma: no cover - the private module moved
        return jaxpr, [True] * len(jaxpr.invars)
    return _pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=keep_inputs)


def used_inputs(eqn, output: int) -> list[bool]:
    """Which inputs of ``eqn`` its output number ``output`` depends on (JAX's DCE rule)."""
    if _pe is None:  # pragma: no cover - the private module moved
        return [True] * len(eqn.invars)
    used_outputs = [k == output for k in range(len(eqn.outvars))]
    rule = _pe.dce_rules.get(eqn.primitive, _pe._default_dce_rule)
    used, _ = rule(used_outputs, eqn)
    if len(used) != len(eqn.invars):  # pragma: no cover - a rule with another convention
        return [True] * len(eqn.invars)
    return list(used)
