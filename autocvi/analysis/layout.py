"""How a latent site's value is laid out for its variational family.

A latent site's value has shape ``plate_shape + inner_shape``: the leading
``plate_ndim`` axes are its plates (and size-1 broadcast axes), over which q
factorises; the remaining *inner* axes are one block of q. Elementwise
families (Normal, Gamma, Beta, Bernoulli, Categorical) factorise over inner
axes too; a Gaussian with more than one inner element is one
MultivariateNormal over the flattened inner axes (so ``w`` with
``.expand([D]).to_event(1)``, a ``GaussianRandomWalk`` or a ``scan`` of
Normals get a full covariance), and Dirichlet's last axis is its event.

Latents whose prior is not an exponential family get a Gaussian on the
unconstrained space, ``z = T(u)`` with ``T = biject_to(support)``
(CVI paper Sec. 5; DESIGN.md section 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from numpyro import distributions as dist
from numpyro.distributions import MultivariateNormal, TransformedDistribution
from numpyro.distributions.transforms import ReshapeTransform

from .. import families
from ..model.coordinates import JointCoordinates
from ..model.trace import ModelError
from .bijections import unconstraining_map
from .constrained import Constrained

__all__ = [
    "LatentLayout",
    "GAUSSIAN_PRIORS",
    "GAUSSIAN_Q_FAMILIES",
    "Reshaped",
    "make_layout",
    "site_posterior",
]

# The q families that are Gaussians (LatentLayout.gaussian).
GAUSSIAN_Q_FAMILIES = ("Normal", "MultivariateNormal")


class Reshaped(TransformedDistribution):
    """``base`` (a vector event) with its event reshaped to ``shape``.

    A reshape is linear, so unlike a general :class:`TransformedDistribution` the
    mean and variance are known: the base's, reshaped (``q.mean`` of a matrix-valued
    site works as for any other Gaussian).
    """

    def __init__(self, base, shape, validate_args=None):
        reshape = ReshapeTransform(tuple(shape), tuple(base.event_shape))
        super().__init__(base, reshape, validate_args=validate_args)

    @property
    def mean(self):
        return self.transforms[0](self.base_dist.mean)

    @property
    def variance(self):
        return self.transforms[0](self.base_dist.variance)


# Priors whose density is Gaussian in the site's value (isinstance, so subclasses
# count too).
GAUSSIAN_PRIORS = (
    dist.Normal,
    dist.MultivariateNormal,
    dist.GaussianRandomWalk,
    dist.LowRankMultivariateNormal,
)
# Largest MultivariateNormal prior that is whitened with a dense Cholesky factor.
_MAX_WHITENED_DIM = 5000


@dataclass(frozen=True)
class LatentLayout:
    """The variational family of one latent site and how its arrays map to the site.

    Attributes:
        name: site name.
        family: the family reported to users: a family name, or
            ``"Unconstrained"`` for a Gaussian on the unconstrained space.
        q_family: the exponential family q actually uses (``"Normal"`` or
            ``"MultivariateNormal"`` for unconstrained sites).
        shape: the site's value shape.
        plate_ndim: number of leading axes over which q factorises.
        family_shape: shape of one draw of q in the family's layout (for a
            MultivariateNormal ``plate_shape + (D,)``).
        transform: ``biject_to(support)`` for unconstrained sites, else None.
        num_categories: K for Categorical sites.
    """

    name: str
    family: str
    q_family: str
    shape: tuple[int, ...]
    plate_ndim: int
    family_shape: tuple[int, ...]
    transform: Any = None
    num_categories: int | None = None
    # (loc, scale_tril) of a constant MultivariateNormal prior: q is kept on the
    # whitened variable u with z = loc + L u, whose prior is N(0, I). This is an
    # affine reparameterisation, so CVI's updates are unchanged, but the prior's
    # message is -I/2 instead of -K^-1/2: kernel matrices are never inverted.
    whitening: Any = None

    @property
    def fam(self) -> families.Family:
        return families.FAMILIES[self.q_family]

    @property
    def plate_shape(self) -> tuple[int, ...]:
        return self.shape[: self.plate_ndim]

    @property
    def discrete(self) -> bool:
        return self.q_family in ("Categorical", "Bernoulli")

    @property
    def gaussian(self) -> bool:
        """q is a Gaussian (elementwise or multivariate) over the site's coordinates."""
        return self.q_family in GAUSSIAN_Q_FAMILIES

    def reference_natural(self, rng_key) -> tuple:
        """The family's reference natural parameter in this layout (structural probes)."""
        return self.fam.reference_natural(rng_key, self.family_shape, self.num_categories)

    @property
    def uniform_weights(self) -> bool:
        """Moment-node weights are equal across elements (all continuous families)."""
        return not self.discrete

    @property
    def weight_ndim(self) -> int:
        """Number of element axes of ``moment_nodes`` weights (after the node axis)."""
        if self.q_family == "MultivariateNormal":
            return len(self.family_shape) - 1
        if self.q_family == "Dirichlet":
            return len(self.family_shape) - 1
        return len(self.family_shape)

    def to_site(self, x):
        """Family-layout draw(s) ``(..., *family_shape)`` -> site values ``(..., *shape)``."""
        lead = jnp.shape(x)[: jnp.ndim(x) - len(self.family_shape)]
        if self.whitening is not None:
            loc, tril = self.whitening
            x = loc + jnp.einsum("...ij,...j->...i", tril, x)
        if self.transform is None:
            return jnp.reshape(x, lead + self.shape)
        u = jnp.reshape(x, lead + self._unconstrained_shape)
        return self.transform(u)

    def from_site(self, z):
        """Site value ``shape`` -> family layout ``family_shape`` (inverse of to_site)."""
        if self.transform is not None:
            z = self.transform.inv(z)
        z = jnp.reshape(z, self.family_shape)
        if self.whitening is not None:
            loc, tril = self.whitening
            tril = jnp.broadcast_to(tril, z.shape + z.shape[-1:])
            z = jax.scipy.linalg.solve_triangular(tril, (z - loc)[..., None], lower=True)[..., 0]
        return z

    @property
    def log_det_whitening(self):
        """log |det dz/du| of the whitening map (a constant of the ELBO)."""
        if self.whitening is None:
            return 0.0
        _, tril = self.whitening
        logdet = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(tril, axis1=-2, axis2=-1))), axis=-1)
        return jnp.sum(jnp.broadcast_to(logdet, self.family_shape[:-1]))

    @property
    def _unconstrained_shape(self) -> tuple[int, ...]:
        return tuple(self.transform.inverse_shape(self.shape))


def make_layout(
    name: str, prior, value, batch_shape, plate_axes: set[int], constant_prior: bool = False
) -> LatentLayout:
    """Choose the family and layout of one latent site from its prior.

    Args:
        name: site name.
        prior: the site's numpyro distribution (wrappers allowed).
        value: an example value of the site.
        batch_shape: the prior's batch shape.
        plate_axes: axes of the value that belong to plates.
        constant_prior: the prior's parameters depend on no latent and no param
            other than data (then a MultivariateNormal prior is whitened).
    """

    shape = tuple(jnp.shape(value))
    base = families.unwrap_distribution(prior)
    # Leading axes that are plates or size-1 broadcast axes: q factorises over them.
    plate_ndim = 0
    while plate_ndim < len(batch_shape) and (
        plate_ndim in plate_axes or batch_shape[plate_ndim] == 1
    ):
        plate_ndim += 1
    plate_shape = shape[:plate_ndim]
    inner = shape[plate_ndim:]

    if isinstance(base, JointCoordinates):
        # The unconstrained coordinates of a joint group (autocvi.analysis.joint):
        # one Gaussian over all of them.
        return LatentLayout(name, "Joint", "MultivariateNormal", shape, 0, shape)
    if isinstance(base, GAUSSIAN_PRIORS):
        if (
            isinstance(base, dist.MultivariateNormal)
            and constant_prior
            and len(inner) == 1
            and inner[0] <= _MAX_WHITENED_DIM
        ):
            return LatentLayout(
                name,
                "MultivariateNormal",
                "MultivariateNormal",
                shape,
                plate_ndim,
                plate_shape + inner,
                whitening=(base.loc, base.scale_tril),
            )
        if math.prod(inner) > 1:
            return LatentLayout(
                name,
                "MultivariateNormal",
                "MultivariateNormal",
                shape,
                plate_ndim,
                plate_shape + (math.prod(inner),),
            )
        return LatentLayout(name, "Normal", "Normal", shape, plate_ndim, shape)
    # Exponential-family priors: the family registry matches by isinstance
    # (Chi2 -> Gamma, BetaProportion -> Beta, Exponential -> Gamma, ...).
    family = families.family_for_distribution(prior)
    fam = None if family is None else family.name
    if fam == "Categorical":
        k = int(jnp.shape(base.probs if hasattr(base, "probs") else base.logits)[-1])
        return LatentLayout(name, fam, fam, shape, plate_ndim, shape, num_categories=k)
    if fam is not None:
        return LatentLayout(name, fam, fam, shape, plate_ndim, shape)
    # Not an exponential family: a Gaussian on the unconstrained space.
    transform = _unconstraining_transform(name, prior)
    ushape = tuple(transform.inverse_shape(shape))
    uinner = ushape[plate_ndim:]
    if math.prod(uinner) > 1:
        return LatentLayout(
            name,
            "Unconstrained",
            "MultivariateNormal",
            shape,
            plate_ndim,
            ushape[:plate_ndim] + (math.prod(uinner),),
            transform,
        )
    return LatentLayout(name, "Unconstrained", "Normal", shape, plate_ndim, ushape, transform)


def _unconstraining_transform(name: str, prior):
    """``biject_to(support)`` (:func:`~autocvi.analysis.bijections.unconstraining_map`), or an
    error naming the site and what to change."""
    dname = type(families.unwrap_distribution(prior)).__name__
    if prior.support.is_discrete:
        raise ModelError(
            f"latent site {name!r} is discrete with a {dname} prior; autocvi infers discrete "
            f"latents only as Categorical or Bernoulli (each value enumerated exactly). "
            f"Rewrite it as a Categorical over its possible values, or sum it out of the "
            f"model (e.g. dist.MixtureSameFamily, or numpyro.factor with a logsumexp over "
            f"a truncated range)."
        )
    try:
        return unconstraining_map(prior.support)
    except NotImplementedError:
        raise ModelError(
            f"latent site {name!r}: its {dname} prior has support {prior.support}, which has "
            f"no bijection to unconstrained space in NumPyro (biject_to), so no Gaussian q "
            f"can be placed on it. Reparameterise the site with a supported constraint "
            f"(real, positive, interval, simplex, ordered_vector, corr_cholesky, ...)."
        ) from None


def site_posterior(lay: LatentLayout, lam):
    """q as a numpyro Distribution over the site's value."""
    base = lay.fam.to_numpyro(lam)
    if lay.whitening is not None:
        loc, tril = lay.whitening
        return MultivariateNormal(
            loc + jnp.einsum("...ij,...j->...i", tril, base.loc),
            scale_tril=jnp.einsum("...ij,...jk->...ik", tril, base.scale_tril),
        )
    if lay.q_family == "MultivariateNormal":
        inner = lay._unconstrained_shape if lay.transform is not None else lay.shape
        inner = inner[lay.plate_ndim :]
        if len(inner) != 1:
            base = Reshaped(base, inner)
    if lay.transform is not None:
        return Constrained(base, lay.transform)
    return base
