"""The one jaxpr walker (``autocvi.jaxpr``) and the passes built on it.

Oracles: ``jax.core.eval_jaxpr`` for evaluation, and the Jacobian for the
dependency pass (a generic point has a non-zero partial derivative exactly
where an output depends on an input, for the functions below).
"""

import ast
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jcore

from autocvi.analysis.conjugacy.interpreter import eval_concrete
from autocvi.jaxpr import CALL_BODY, call_body, dce, interpret
from autocvi.model.trace import _output_dependencies

PACKAGE = Path(__file__).resolve().parents[1] / "autocvi"


def _scan_sum(a, b, c):
    def body(carry, x):
        return carry * a + x, carry + c

    last, ys = jax.lax.scan(body, 1.0, jnp.stack([b, b, b]))
    return last, ys.sum()


@jax.custom_jvp
def _custom(x):
    return jnp.log1p(jnp.exp(x))


_custom.defjvp(lambda p, t: (_custom(p[0]), t[0] * jax.nn.sigmoid(p[0])))

FUNCTIONS = {
    # name: (function of three scalars, outputs)
    "plain": lambda a, b, c: (a * b, jnp.sin(c)),
    "jit": lambda a, b, c: (jax.jit(lambda u, v: u + v)(a, c), b**2),
    "custom_jvp": lambda a, b, c: (_custom(a) * c, jax.nn.relu(-b)),
    "checkpoint": lambda a, b, c: (jax.checkpoint(lambda u, v: u * jnp.exp(v))(b, c), a),
    # both branches read u and v, neither reads w: DCE must drop c from output 0
    "cond": lambda a, b, c: (
        jax.lax.cond(a > 0, lambda u, v, w: u * v, lambda u, v, w: u - v, a, b, c),
        c,
    ),
    "scan": _scan_sum,
    "nested": lambda a, b, c: (jax.jit(lambda u: jax.jit(lambda w: w * c)(u))(a), b + 0.0),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_walker_evaluates_like_jax(name):
    fn = FUNCTIONS[name]
    args = [np.float32(0.3), np.float32(-1.2), np.float32(0.7)]
    closed = jax.make_jaxpr(fn)(*args)
    expected = jcore.jaxpr_as_fun(closed)(*args)
    got = eval_concrete(closed.jaxpr, closed.consts, args)
    np.testing.assert_allclose(np.array(got, float), np.array(expected, float), rtol=1e-6)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_dependencies_are_exactly_the_jacobian_pattern(name):
    """Sound (no dependency missed) and complete (none invented), scan and cond included."""
    fn = FUNCTIONS[name]
    args = (np.float32(0.3), np.float32(-1.2), np.float32(0.7))
    closed = jax.make_jaxpr(fn)(*args)
    masks = _output_dependencies(closed.jaxpr)
    jac = jax.jacobian(lambda *xs: jnp.stack(fn(*xs)), argnums=(0, 1, 2))(*args)
    for k, mask in enumerate(masks):
        expected = {i for i in range(3) if abs(float(jac[i][k])) > 0}
        got = {i for i in range(3) if mask >> i & 1}
        assert got == expected, (name, k, got, expected)


def test_calls_are_entered_and_others_handed_over():
    closed = jax.make_jaxpr(FUNCTIONS["nested"])(1.0, 2.0, 3.0)
    seen = []

    def record(eqn, ins):
        seen.append(eqn.primitive.name)
        return [None] * len(eqn.outvars)

    interpret(closed.jaxpr, closed.consts, [None] * 3, record)
    assert not set(seen) & set(CALL_BODY), seen  # bodies walked, never the call itself
    assert "mul" in seen
    seen.clear()
    interpret(closed.jaxpr, closed.consts, [None] * 3, record, enter=())
    assert set(seen) & set(CALL_BODY)


def test_call_body_and_dce():
    closed = jax.make_jaxpr(lambda a, b: jax.jit(lambda u: u + 1.0)(a))(1.0, 2.0)
    (eqn,) = closed.jaxpr.eqns
    body, consts = call_body(eqn)
    assert len(body.invars) == 1 and consts == []
    pruned, used = dce(closed.jaxpr)
    assert list(used) == [True, False] and len(pruned.invars) == 1
    kept, used = dce(closed.jaxpr, keep_inputs=True)
    assert len(kept.invars) == 2


def test_only_the_walker_touches_jax_private_modules():
    """One place to change when JAX moves its internals."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "jaxpr":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n.startswith("jax._src") for n in names):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not offenders, offenders
