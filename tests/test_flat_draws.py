"""Shaped random draws compiled flat (``autocvi/jaxpr/flat_draws.py``): the same numbers.

The rewrite must be sound (every output bit for bit what ``jax.core.eval_jaxpr`` gives,
inside calls, scans, loops and conditionals, with batched keys, in both precisions) and
complete (no threefry draw over two or more axes left where it rewrites: in a CVI step's
compiled program, none at all).
"""

import collections
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jcore

import autocvi
from autocvi.engine.step import cvi
from autocvi.jaxpr import flat_draws

sys.path.insert(0, str(Path(__file__).parent))
from zoo.models import small_negative_binomial_glm  # noqa: E402


def _shaped_draws(jaxpr) -> collections.Counter:
    """Threefry ``random_bits`` over two or more axes, by enclosing primitive path."""
    found = collections.Counter()

    def walk(j, path):
        for eqn in j.eqns:
            if eqn.primitive.name == "random_bits" and len(eqn.params["shape"]) >= 2:
                found[path] += 1
            for value in eqn.params.values():
                for v in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(v, jcore.ClosedJaxpr):
                        walk(v.jaxpr, f"{path}/{eqn.primitive.name}")
                    elif isinstance(v, jcore.Jaxpr):
                        walk(v, f"{path}/{eqn.primitive.name}")

    walk(jaxpr, "")
    return found


def _program(key, x):
    """Shaped draws at the top, in a jitted call, a scan, a while loop, both branches of a
    cond and under vmap (batched keys), mixed with arithmetic on ``x``."""
    k = jax.random.split(key, 6)
    top = jax.random.normal(k[0], (4, 3)) * x
    called = jax.jit(lambda kk: jax.random.uniform(kk, (2, 5, 3)))(k[1])

    def body(carry, kk):
        return carry + jax.random.normal(kk, (4, 3)).sum(), jax.random.bits(kk, (3, 2))

    carry, bits = jax.lax.scan(body, x.sum(), jax.random.split(k[2], 3))

    def loop_body(c):
        i, acc = c
        return i + 1, acc + jax.random.normal(jax.random.fold_in(k[3], i), (2, 3))

    _, looped = jax.lax.while_loop(lambda c: c[0] < 3, loop_body, (0, jnp.zeros((2, 3))))
    branched = jax.lax.cond(
        x.sum() > 0,
        lambda kk: jax.random.normal(kk, (3, 3)),
        lambda kk: jax.random.gamma(kk, 2.0, (3, 3)),
        k[4],
    )
    batched = jax.vmap(lambda kk: jax.random.normal(kk, (2, 3)))(jax.random.split(k[5], 4))
    return top, called, carry, bits, looped, branched, batched


@pytest.mark.parametrize(
    "precision", ["float32", pytest.param("float64", marks=pytest.mark.float64)]
)
def test_flat_draws_give_the_same_numbers_and_leave_no_shaped_draw(precision):
    key, x = jax.random.PRNGKey(7), jnp.arange(12.0).reshape(4, 3) / 10.0
    closed = jax.make_jaxpr(_program)(key, x)
    assert sum(_shaped_draws(closed.jaxpr).values()) >= 7  # the test has something to rewrite

    def plain(key, x):
        return jcore.jaxpr_as_fun(closed)(key, x)

    def flat(key, x):
        return flat_draws.evaluate(closed.jaxpr, closed.consts, [key, x])

    expected = jax.jit(plain)(key, x)
    got = jax.jit(flat)(key, x)
    for e, g in zip(expected, got):
        assert e.dtype == g.dtype and e.shape == g.shape
        if jnp.issubdtype(e.dtype, jnp.floating):
            assert e.dtype == jnp.dtype(precision)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e))
    # complete: the evaluated program draws nothing over two or more axes
    assert not _shaped_draws(jax.make_jaxpr(flat)(key, x).jaxpr)
    assert flat_draws.has_shaped_draws(closed.jaxpr)
    assert not flat_draws.has_shaped_draws(jax.make_jaxpr(flat)(key, x).jaxpr)


def test_a_program_without_shaped_draws_is_evaluated_as_it_is():
    def f(key, x):
        return jax.random.normal(key, (5,)) + jnp.sin(x)

    closed = jax.make_jaxpr(f)(jax.random.PRNGKey(0), jnp.ones(5))
    assert not flat_draws.has_shaped_draws(closed.jaxpr)
    traced = jax.make_jaxpr(lambda k, x: flat_draws.evaluate(closed.jaxpr, closed.consts, [k, x]))(
        jax.random.PRNGKey(0), jnp.ones(5)
    )
    assert str(traced.jaxpr) == str(
        jax.make_jaxpr(jcore.jaxpr_as_fun(closed))(jax.random.PRNGKey(0), jnp.ones(5)).jaxpr
    )


def test_a_cvi_step_compiles_without_shaped_draws_and_steps_the_same():
    """A joint Gaussian's Monte Carlo draws (message, line search, ELBO) are (S, D)
    arrays: the step's program draws them flat, and its result is the same."""
    algorithm = cvi(autocvi.plan(*small_negative_binomial_glm()))
    state = jax.jit(algorithm.init)(jax.random.PRNGKey(0))
    leaves, tree = jax.tree.flatten(state)
    closed = jax.make_jaxpr(lambda *ls: algorithm.step(jax.tree.unflatten(tree, ls)))(*leaves)
    assert _shaped_draws(closed.jaxpr)  # the step does draw (S, D) arrays

    def flat(consts, ls):
        return flat_draws.evaluate(closed.jaxpr, consts, ls)

    assert not _shaped_draws(jax.make_jaxpr(flat)(list(closed.consts), leaves).jaxpr)
    expected = jax.jit(lambda c, ls: jcore.jaxpr_as_fun(jcore.ClosedJaxpr(closed.jaxpr, c))(*ls))
    for e, g in zip(
        expected(list(closed.consts), leaves), jax.jit(flat)(list(closed.consts), leaves)
    ):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e))
