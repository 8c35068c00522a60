"""``CVIGuide``: autocvi's q as a NumPyro guide (the ``AutoGuide`` interface).

::

    guide = cvi.guide(state)                       # or CVIGuide(fit_result.posterior)
    Predictive(model, guide=guide, num_samples=1000)(rng_key, X)   # posterior predictive
    guide.quantiles(quantiles=[0.05, 0.5, 0.95])   # site -> array (3,) + site shape

Called as a model, the guide draws every latent site of the model from q
(``numpyro.sample(name, q_site)``), so ``Predictive`` runs it, then the model
conditioned on its draws, exactly as with an ``AutoGuide``. The members of a
joint Gaussian group (``plan()`` lists them) are drawn together: the group's
vector is an auxiliary site and each member a ``Delta`` at its slice, as
``AutoMultivariateNormal`` does, so their correlations are kept. q is already
fitted: the guide has no ``numpyro.param`` sites, and the ``params`` argument of
its methods (NumPyro's ``AutoGuide`` signature) only selects another state
when it is a :class:`~autocvi.infer.cvi.CVIRunState` (or a ``CVIRunResult`` or
a ``FitResult``); a dict (``svi_result.params``) is accepted and ignored.

Marginal quantiles and moments (also used by :func:`autocvi.print_summary`):

* exact when the site's q is Gaussian (Normal, the marginals of a
  MultivariateNormal or of a Gaussian block), or a Gaussian pushed through
  elementwise monotone transforms (``exp``, ``sigmoid``, ``softplus``, affine,
  power, reshapes and compositions: the constrained sites' q): the Gaussian's
  quantiles are mapped through the transforms (the lower and upper tails swap
  where a transform decreases);
* else through the distribution's own ``icdf`` when it has one;
* else Monte Carlo, 4000 draws with a fixed key (Gamma, Beta, Dirichlet,
  discrete q).

Means and standard deviations come from the distribution's ``mean`` and
``variance`` when it has them, from 64-node Gauss-Hermite quadrature for a
transformed Gaussian, else from the same 4000 draws.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import ndtri

from ..analysis.constrained import Constrained, chain_moments, normal_chain, transform_sign
from ..analysis.layout import site_posterior

__all__ = ["CVIGuide", "joint_posteriors", "marginal_quantiles", "marginal_moments", "NUM_DRAWS"]

# Draws of the Monte Carlo fallback, and its key (results are reproducible).
NUM_DRAWS = 4000
_DRAW_KEY = 0


class CVIGuide:
    """q as a guide: callable as a model, plus the ``AutoGuide`` query methods.

    Args:
        posterior: latent site -> numpyro Distribution over the site's value
            (``CVI.get_posterior(state)``, ``FitResult.posterior``), in model order;
            members of joint groups with their marginals.
        joint: ``(group, q_z)`` per joint Gaussian group
            (:class:`autocvi.analysis.joint.JointGroup` and q over its vector).
        model: the model (kept for reference, as ``AutoGuide.model``).
        source, state: the :class:`~autocvi.infer.cvi.CVI` object and the
            state the guide was made from, so that another ``CVIRunState``
            passed as ``params`` selects that state's q.
    """

    def __init__(self, posterior: dict, *, joint=(), model=None, source=None, state=None):
        self.posterior = dict(posterior)
        self.joint = tuple(joint)
        self.model = model
        self._source = source
        self._state = state

    @classmethod
    def from_fit(cls, result, model=None) -> CVIGuide:
        """The guide of an :func:`autocvi.fit` result."""
        joint = joint_posteriors(result.schedule, result.state.natural)
        return cls(result.posterior, joint=joint, model=model)

    def __call__(self, *args, **kwargs) -> dict:
        """Draw every latent site from q (the model's arguments are not needed)."""
        out = {}
        for group, q_z in self.joint:
            z = numpyro.sample(group.name, q_z, infer={"is_auxiliary": True})
            values = group.values(z)
            for m in group.members:
                delta = dist.Delta(values[m.name], event_dim=len(m.shape))
                out[m.name] = numpyro.sample(m.name, delta)
        for name, q in self.posterior.items():
            if name not in out:
                out[name] = numpyro.sample(name, q)
        return out

    def _resolve(self, params) -> CVIGuide:
        """The guide of the state ``params`` names (itself for None or a dict)."""
        if params is None or isinstance(params, dict):
            return self
        if hasattr(params, "posterior") and hasattr(params, "schedule"):  # FitResult
            return CVIGuide.from_fit(params, self.model)
        state = getattr(params, "state", None)
        if hasattr(state, "plan"):  # CVIRunResult
            params = state
        if hasattr(params, "plan") and self._source is not None:  # CVIRunState
            if params is self._state:
                return self
            return self._source.guide(params)
        raise TypeError(
            f"params must be None, a dict, a CVIRunState, a CVIRunResult or a FitResult; "
            f"got {type(params).__name__}"
        )

    def get_posterior(self, params=None) -> dict:
        """Latent site -> q (a numpyro Distribution over the site's value; marginals
        for the members of joint groups)."""
        return dict(self._resolve(params).posterior)

    def sample_posterior(self, rng_key, params=None, *args, sample_shape=(), **kwargs) -> dict:
        """Draws of every latent site: site -> array ``sample_shape + site shape``
        (joint groups drawn jointly).

        Only the latent sample sites; run ``Predictive`` for deterministic and
        observed sites.
        """
        if isinstance(rng_key, int):
            rng_key = jax.random.PRNGKey(rng_key)
        guide = self._resolve(params)
        sample_shape = tuple(sample_shape)
        keys = jax.random.split(rng_key, len(guide.posterior) + len(guide.joint) + 1)
        out = {}
        for k, (group, q_z) in zip(keys, guide.joint):
            out.update(group.values(q_z.sample(k, sample_shape)))
        for k, (name, q) in zip(keys[len(guide.joint) :], guide.posterior.items()):
            if name not in out:
                out[name] = q.sample(k, sample_shape)
        return {name: out[name] for name in guide.posterior}

    def median(self, params=None) -> dict:
        """Posterior median of every element of every latent site (exact when possible)."""
        out = self.quantiles(params, [0.5])
        return {k: v[0] for k, v in out.items()}

    def quantiles(self, params=None, quantiles=(0.05, 0.5, 0.95)) -> dict:
        """Marginal quantiles: site -> array ``(len(quantiles),) + site shape``.

        Exact for Gaussian and monotone-transformed Gaussian q, else Monte
        Carlo (module docstring).
        """
        posterior = self.get_posterior(params)
        return {k: marginal_quantiles(q, quantiles)[0] for k, q in posterior.items()}


# --------------------------------------------------------------------------
# Marginals of q
# --------------------------------------------------------------------------


def joint_posteriors(schedule, natural) -> list:
    """``(group, q_z)`` per joint Gaussian group of ``schedule``: q over the group's
    vector at the natural parameters ``natural`` (the engine state's)."""
    out = []
    for group in schedule.joint:
        block = schedule.blocks.get(group.name)
        lam = natural[group.name]
        q_z = (
            block.posterior(lam)
            if block is not None
            else site_posterior(schedule.nodes[group.name].layout, lam)
        )
        out.append((group, q_z))
    return out


def marginal_quantiles(q, probs, *, num_draws: int = NUM_DRAWS):
    """``(values, exact)``: the elementwise quantiles of ``q`` at ``probs``.

    ``values`` has shape ``(len(probs),) + batch_shape + event_shape``;
    ``exact`` says whether they are exact or Monte Carlo estimates.
    """
    probs = jnp.asarray(probs, dtype=jnp.result_type(float))
    value_shape = tuple(q.batch_shape) + tuple(q.event_shape)
    chain = normal_chain(q)
    if chain is not None:
        loc, scale, transforms = chain
        p = jnp.reshape(probs, (-1,) + (1,) * jnp.ndim(loc))
        lo, hi = loc + scale * ndtri(p), loc + scale * ndtri(1.0 - p)
        for t in transforms:
            sign = transform_sign(t)
            tlo, thi = t(lo), t(hi)
            lo = jnp.where(sign > 0, tlo, thi)
            hi = jnp.where(sign > 0, thi, tlo)
        return jnp.broadcast_to(lo, (probs.shape[0],) + value_shape), True
    if not q.event_shape:
        try:
            p = jnp.reshape(probs, (-1,) + (1,) * len(value_shape))
            values = q.icdf(p)
            if bool(jnp.all(jnp.isfinite(values))):
                return jnp.broadcast_to(values, (probs.shape[0],) + value_shape), True
        except Exception:  # noqa: BLE001 - no icdf (NotImplementedError, missing TFP, ...)
            pass
    draws = _draws(q, num_draws)
    return jnp.quantile(draws, probs, axis=0), False


def marginal_moments(q, *, num_draws: int = NUM_DRAWS):
    """``(mean, std, how)`` of every element of ``q``; ``how`` is ``"exact"``,
    ``"quadrature"`` or ``"monte carlo"``."""
    if not isinstance(q, Constrained):  # a Constrained q's moments are quadrature's
        try:
            mean, var = q.mean, q.variance
            value_shape = tuple(q.batch_shape) + tuple(q.event_shape)
            if bool(jnp.all(jnp.isfinite(mean))) and bool(jnp.all(jnp.isfinite(var))):
                mean = jnp.broadcast_to(mean, value_shape)
                var = jnp.broadcast_to(var, value_shape)
                return mean, jnp.sqrt(var), "exact"
        except Exception:  # noqa: BLE001 - e.g. TransformedDistribution has no mean
            pass
    chain = normal_chain(q)
    if chain is not None:
        mean, var = chain_moments(*chain)
        return mean, jnp.sqrt(var), "quadrature"
    draws = _draws(q, num_draws)
    return jnp.mean(draws, axis=0), jnp.std(draws, axis=0), "monte carlo"


def _draws(q, num_draws):
    draws = q.sample(jax.random.PRNGKey(_DRAW_KEY), (num_draws,))
    return jnp.asarray(draws, dtype=jnp.result_type(float))
