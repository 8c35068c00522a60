"""Initial natural parameters for every node of a schedule.

Each node starts at its prior with the parents held at one prior draw (the
exact message of its own prior factor, so no family-specific code is
needed). Gaussian nodes are centred on a prior draw of the site, which breaks
the symmetry of mixture components; unconstrained nodes start as a narrow
Gaussian around the unconstrained image of a prior draw.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..analysis.expectations import expect, moment_point_set
from ..model.message_kinds import EXACT
from ..plan.schedule import Schedule, _plate_examples

__all__ = ["initial_natural"]

# Variance of the initial Gaussian of an unconstrained node.
_UNCONSTRAINED_INIT_VAR = 0.1


def initial_natural(schedule: Schedule, rng_key) -> dict:
    """``{latent: natural parameters}`` to start CVI from."""
    rng_key, draw_key = jax.random.split(rng_key)
    # Start from a prior draw made with this key, so that rng_key chooses the
    # starting point (and different keys restart a mixture elsewhere).
    values = {**schedule.graph.example_values, **schedule.graph.draw_latents(draw_key)}
    params = schedule.params
    plates = _plate_examples(schedule.graph)
    natural = {}
    for name, node in schedule.nodes.items():
        lay = node.layout
        rng_key, sub = jax.random.split(rng_key)
        if name in schedule.blocks:
            natural[name] = schedule.blocks[name].init_sites()
            continue
        if lay.discrete:
            # Responsibilities per element: the continuous nodes are updated
            # first from them, which breaks the symmetry of mixture components
            # and topics differently per rng_key (a prior draw of the weights is
            # the same for every element). From the data where a likelihood
            # observes continuous values per element (k-means++ seeding), else
            # a Dirichlet(1) draw.
            rows = _observed_rows(schedule, name, {**values, **params, **plates})
            if rows is None or node.local or lay.q_family != "Categorical":
                natural[name] = _full_size(node, _random_responsibilities(lay, sub))
            else:
                log_r = _kmeans_pp_responsibilities(rows, lay.num_categories, sub)
                natural[name] = (jnp.reshape(log_r, lay.family_shape + (-1,)),)
            continue
        draw = lay.from_site(values[name])
        if lay.family in ("Unconstrained", "Joint"):
            natural[name] = _full_size(node, _gaussian_at(lay, draw, _UNCONSTRAINED_INIT_VAR))
            continue
        fplan = schedule.factors[name]
        align = fplan.alignments[name]
        fixed = {**plates, **params, **{j: values[j] for j in fplan.latents if j != name}}

        def expected(mu, lay=lay, fplan=fplan, align=align, fixed=fixed, name=name):
            return expect(fplan.log_density, {name: moment_point_set(lay, mu, align)}, fixed)

        reference = lay.reference_natural(sub)
        lam = jax.grad(expected)(lay.fam.natural_to_mean(reference))
        if lay.q_family not in ("Normal", "MultivariateNormal"):
            lam = _representable(
                lam, reference, lambda lam_, lay=lay: expected(lay.fam.natural_to_mean(lam_))
            )
        # Gaussian nodes with estimated messages start at the prior mean with at
        # most unit variance (a prior draw, or the prior's spread, can put the
        # expectations of exp-like likelihoods out of floating-point range);
        # nodes with only exact messages start centred on a prior draw, which
        # breaks the symmetry of mixture components.
        estimated = any(kind != EXACT.name for _, kind in node.incoming)
        if lay.q_family == "MultivariateNormal":
            prec2 = 0.5 * (lam[1] + jnp.swapaxes(lam[1], -1, -2))
            if estimated:
                mean = jnp.linalg.solve(-2.0 * prec2, lam[0][..., None])[..., 0]
                prec2 = prec2 - 0.5 * jnp.eye(prec2.shape[-1], dtype=prec2.dtype)
            else:
                mean = draw
            lam = (-2.0 * jnp.einsum("...ij,...j->...i", prec2, mean), prec2)
        elif lay.q_family == "Normal":
            prec2 = lam[1]
            if estimated:
                prec2 = prec2 - 0.5
                mean = -0.5 * lam[0] / lam[1]
            else:
                mean = draw
            lam = (-2.0 * prec2 * mean, prec2)
        natural[name] = _full_size(node, lam)
    return natural


def _representable(lam, reference, expected):
    """``lam``, or the first of its mixtures with the family's reference natural
    parameters at which the prior's expected log density is finite.

    A prior as vague as BUGS's ``Gamma(0.001, 0.001)`` has ``E[log z]`` near -1000, whose
    moment nodes (``exp`` of it) underflow to 0 at the working precision: the first
    messages and ELBO are then NaN, every step is refused, and q stays at the prior
    (float32: from ``Gamma(0.02, 0.02)`` down). Starting between the prior and the
    reference (a mixture in natural parameters stays in the family's domain) is as good
    a start for these exact updates, which leave it after one step. Traced: the choice
    is made with ``where``, the first finite candidate wins.
    """
    steps = (0.0, 0.5, 0.9, 0.99, 1.0)
    candidates = [
        jax.tree_util.tree_map(lambda a, r, t=t: (1.0 - t) * a + t * r, lam, reference)
        for t in steps
    ]
    chosen = candidates[-1]
    for candidate in reversed(candidates[:-1]):
        finite = jnp.all(jnp.isfinite(expected(candidate)))
        chosen = jax.tree_util.tree_map(
            lambda c, o, f=finite: jnp.where(f, c, o), candidate, chosen
        )
    return chosen


def _full_size(node, lam):
    """Tile a local node's sampled elements up to the plate's full size N."""
    for axis, plate in node.subsample_axes:
        take = jnp.arange(plate.size) % plate.subsample_size
        lam = jax.tree_util.tree_map(lambda a, ax=axis, t=take: jnp.take(a, t, axis=ax), lam)
    return lam


def _gaussian_at(lay, mean, var):
    if lay.q_family == "MultivariateNormal":
        d = mean.shape[-1]
        prec = jnp.broadcast_to(jnp.eye(d, dtype=mean.dtype) / var, mean.shape + (d,))
        return (mean / var, -0.5 * prec)
    return (mean / var, jnp.full(mean.shape, -0.5 / var, mean.dtype))


def _observed_rows(schedule: Schedule, name: str, values: dict):
    """The continuous observations of ``name``'s first likelihood, one row per element
    of ``name`` (``(elements, features)``), or None when no likelihood observes
    continuous values aligned with every element axis of ``name``."""
    lay = schedule.nodes[name].layout
    for fname in schedule.graph.factors_of(name):
        fac = schedule.graph.factors[fname]
        if fac.kind != "likelihood" or fname not in schedule.factors:
            continue
        axes = schedule.factors[fname].alignments[name].axes
        if not axes or any(a is None for a in axes):
            continue
        d, obs = schedule.graph.site_fn(fname)(values)
        if d.support.is_discrete:  # category labels or codes: no distances
            continue
        obs = jnp.broadcast_to(jnp.asarray(obs), d.batch_shape + d.event_shape)
        rows = jnp.moveaxis(obs, list(axes), list(range(len(axes))))
        if rows.shape[: len(axes)] != lay.family_shape[: len(axes)]:
            continue
        return jnp.nan_to_num(jnp.reshape(rows, (int(np.prod(rows.shape[: len(axes)])), -1)))
    return None


def _kmeans_pp_responsibilities(rows, num_categories: int, key, seedings: int = 4):
    """Log responsibilities ``(elements, K)`` from k-means on the standardised
    ``rows``: of ``seedings`` runs (greedy k-means++ seeding then Lloyd
    iterations, :func:`_kmeans`), the one with the smallest total squared
    distance. Each element's responsibilities are a softmax of minus its
    squared distances over twice the mean squared distance to the nearest
    centre, mixed with 10% uniform so that no component starts empty."""
    rows = (rows - jnp.mean(rows, 0)) / (jnp.std(rows, 0) + 1e-6)
    keys = jax.random.split(key, seedings)
    centres, inertia = jax.vmap(lambda k: _kmeans(rows, num_categories, k))(keys)
    d2 = jnp.sum((rows[:, None, :] - centres[jnp.argmin(inertia)][None]) ** 2, -1)
    r = jax.nn.softmax(-d2 / (2.0 * jnp.mean(jnp.min(d2, -1)) + 1e-6), axis=-1)
    return jnp.log(0.9 * r + 0.1 / num_categories)


def _kmeans(rows, num_categories: int, key, lloyd_steps: int = 10):
    """``(centres, total squared distance)``: greedy k-means++ seeding (Arthur and
    Vassilvitskii, 2007: each centre drawn with probability proportional to the
    squared distance to the nearest centre so far; of ``2 + log K`` draws the one
    that lowers the total most is kept), then ``lloyd_steps`` Lloyd iterations."""
    n, trials = rows.shape[0], 2 + int(np.log(num_categories))
    keys = jax.random.split(key, num_categories)
    centres = [rows[jax.random.randint(keys[0], (), 0, n)]]
    nearest = jnp.sum((rows - centres[0]) ** 2, -1)
    for k in range(1, num_categories):
        picks = jax.random.categorical(keys[k], jnp.log(nearest + 1e-30), shape=(trials,))
        after = jnp.minimum(nearest[None], jnp.sum((rows[None] - rows[picks][:, None]) ** 2, -1))
        best = jnp.argmin(jnp.sum(after, -1))
        centres.append(rows[picks[best]])
        nearest = after[best]

    def distances(c):
        return jnp.sum((rows[:, None, :] - c[None]) ** 2, -1)

    def lloyd(_, c):
        hard = jax.nn.one_hot(jnp.argmin(distances(c), -1), num_categories, dtype=rows.dtype)
        counts = jnp.sum(hard, 0)[:, None]
        return jnp.where(counts > 0, hard.T @ rows / jnp.maximum(counts, 1.0), c)

    centres = jax.lax.fori_loop(0, lloyd_steps, lloyd, jnp.stack(centres))
    return centres, jnp.sum(jnp.min(distances(centres), -1))


def _random_responsibilities(lay, key):
    """Natural parameters of a Categorical / Bernoulli q with Dirichlet(1) probabilities."""
    if lay.q_family == "Categorical":
        shape = lay.family_shape + (lay.num_categories,)
        return (jnp.log(jax.random.dirichlet(key, jnp.ones(shape[-1:]), shape[:-1])),)
    p = jax.random.uniform(key, lay.family_shape, minval=0.05, maxval=0.95)
    return (jnp.log(p) - jnp.log1p(-p),)
