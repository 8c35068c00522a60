"""After a fit: latents that q keeps independent but the posterior couples strongly.

q factorises across its nodes (mean-field between a Gamma precision and a Gaussian, or
between a group precision and the group effects of a centred hierarchy): each factor's
variance is then that of the posterior *conditional* on the others, not its marginal,
and where the posterior correlates them the sds come out too small, silently (a
local-level model's precisions: 0.52-0.56 of NUTS's sds, ``converged=True``). This
module measures it from the log joint's curvature in the unconstrained coordinates (the
Laplace view): with ``P`` the negative Hessian, a factor's coordinates have conditional
variances ``diag((P_BB)^-1)`` (what a mean-field fit can reach) and marginal ones
``diag(P^-1)``; their ratio is the shrinkage of the sds mean-field causes. ``P`` is read
at q's centre and at the log joint's mode near it (a few Newton steps), and the larger
shrinkage of the two counts. Below :data:`SD_RATIO_LIMIT` the fit warns, naming the
latent and the one it is most correlated with.

The check is skipped (no claim) for models with discrete latents, subsampled plates,
integrated conditionals or more than :data:`MAX_COORDINATES` coordinates, when q has a
single factor, and where the curvature is not positive definite at either point or too
ill-conditioned for the working precision.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer.util import potential_energy

from ..analysis.constrained import Constrained, normal_chain
from ..analysis.precondition import local_quadratic, newton_centre
from .convergence import FitWarning

__all__ = [
    "Coupling",
    "coupling_warnings",
    "mean_field_couplings",
    "warn_mean_field_coupling",
    "SD_RATIO_LIMIT",
]

# Warn when mean-field shrinks a coordinate's sd below this fraction of its marginal's.
SD_RATIO_LIMIT = 0.7
MAX_COORDINATES = 200


@dataclass(frozen=True)
class Coupling:
    """A latent whose sd mean-field shrinks to ``ratio`` of the Laplace marginal's, and the
    latent of another factor of q it is most correlated with (``corr``)."""

    name: str
    partner: str
    corr: float
    ratio: float

    @property
    def message(self) -> str:
        return (
            f"q treats {self.name!r} as independent of {self.partner!r} (mean-field), but the "
            f"posterior couples them: near q's centre the log joint's curvature correlates "
            f"them at {self.corr:+.2f}, so {self.name!r}'s sd is likely about "
            f"{self.ratio:.2f} of the posterior's (a Laplace estimate; the means can be off "
            "too). Give both latents non-conjugate priors (e.g. LogNormal instead of Gamma) "
            "so that they share one joint Gaussian (plan option joint_sites), or compare "
            "with NUTS or SVI's AutoMultivariateNormal."
        )


def warn_mean_field_coupling(couplings: list[Coupling]):
    """Issue a :class:`FitWarning` per coupling."""
    for c in couplings:
        warnings.warn(c.message, FitWarning, stacklevel=3)


def coupling_warnings(model, data: dict, schedule, posterior: dict, params: dict) -> list[str]:
    """:func:`mean_field_couplings`' warnings, one line each."""
    return [c.message for c in mean_field_couplings(model, data, schedule, posterior, params)]


def mean_field_couplings(
    model, data: dict, schedule, posterior: dict, params: dict
) -> list[Coupling]:
    """One :class:`Coupling` per latent whose sds mean-field shrinks below
    ``SD_RATIO_LIMIT`` of the Laplace marginal's (module docstring); [] when the check
    does not apply."""
    graph = schedule.user_graph or schedule.graph
    if (
        schedule.integrated
        or any(f.subsampled for f in schedule.factors.values())
        or any(v.discrete for v in graph.variables.values() if not v.observed)
    ):
        return []
    owner = {m: g.name for g in schedule.joint for m in g.member_names}
    centre, ids, names, next_id = {}, {}, {}, 0
    for name, q in posterior.items():
        if name not in graph.variables:
            return []
        value = _unconstrained_centre(q, graph.example_site(name)[0].support)
        if value is None:
            return []
        centre[name] = value
        node = schedule.nodes.get(name)
        plates = 0 if name in owner or node is None else node.layout.plate_ndim
        shape = jnp.shape(value)
        elements = int(np.prod(shape[:plates]))
        per_element = int(np.prod(shape[plates:]))
        if name in owner:
            key = owner[name]
            if key not in names:
                names[key], next_id = next_id, next_id + 1
            ids[name] = np.full(elements * per_element, names[key])
        else:
            ids[name] = next_id + np.repeat(np.arange(elements), per_element)
            next_id += elements
    flat, unravel = ravel_pytree(centre)
    if flat.size > MAX_COORDINATES or next_id < 2:
        return []
    # ravel_pytree orders a dict by its sorted keys
    order = sorted(centre)
    factor_of = np.concatenate([ids[n] for n in order])
    site_of = np.concatenate([np.full(ids[n].size, i) for i, n in enumerate(order)])
    fixed = handlers.substitute(model, data=dict(params)) if params else model

    def log_joint(x):
        return -potential_energy(fixed, (), data, unravel(x))

    try:  # the Laplace point near q's centre (q's mean need not be a mode: a Gamma's)
        quadratic = local_quadratic(log_joint)
        _, at_mode = newton_centre(quadratic, flat)
        at_centre = np.asarray(quadratic(flat)[2], np.float64)
    except Exception:  # noqa: BLE001 - a model jax cannot differentiate twice: no claim
        return []
    # Read the curvature at both points and keep, per coordinate, the larger shrinkage:
    # the mode is the better point where q's mean is not one (Gamma precisions of a
    # local-level model: 0.63 estimated there, 0.52-0.56 against NUTS, above 0.7 at q's
    # centre), q's centre where the climb leaves q's region (a funnel's neck, where a
    # centred hierarchy with a vague group precision reads 1.0; 0.53 at q's centre,
    # 0.39-0.69 against NUTS).
    eps = np.finfo(np.asarray(flat).dtype).eps
    estimates = [e for e in (_shrinkage(h, factor_of, eps) for h in (at_mode, at_centre)) if e]
    if not estimates:
        return []
    ratio, corr = estimates[0]
    for other_ratio, other_corr in estimates[1:]:
        lower = other_ratio < ratio
        ratio = np.where(lower, other_ratio, ratio)
        corr = np.where(lower[:, None], other_corr, corr)
    out = []
    for i, name in enumerate(order):
        mine = np.flatnonzero(site_of == i)
        worst = mine[np.argmin(ratio[mine])]
        if ratio[worst] >= SD_RATIO_LIMIT:
            continue
        others = np.flatnonzero(factor_of != factor_of[worst])
        partner = others[np.argmax(np.abs(corr[worst, others]))]
        out.append(
            Coupling(
                name, order[site_of[partner]], float(corr[worst, partner]), float(ratio[worst])
            )
        )
    return out


def _shrinkage(hessian, factor_of, eps):
    """``(ratio, corr)`` from the log joint's curvature ``hessian`` (the negative Hessian):
    per coordinate, the sd mean-field across ``factor_of``'s blocks can reach over the
    marginal sd, and the correlations; None where the curvature is not positive
    definite (a saddle) or is beyond the working precision ``eps``."""
    precision = 0.5 * (hessian + hessian.T)
    if not np.all(np.isfinite(precision)):
        return None
    eig = np.linalg.eigvalsh(precision)
    if eig[0] <= 0 or eig[-1] * eps > 0.02 * eig[0]:
        return None
    cov = np.linalg.inv(precision)
    marginal_sd = np.sqrt(np.diag(cov))
    ratio = np.ones(len(marginal_sd))
    for f in np.unique(factor_of):
        block = np.flatnonzero(factor_of == f)
        conditional = np.linalg.inv(precision[np.ix_(block, block)])
        ratio[block] = np.sqrt(np.diag(conditional)) / marginal_sd[block]
    return ratio, cov / np.outer(marginal_sd, marginal_sd)


def _unconstrained_centre(q, support):
    """q's centre on the unconstrained coordinates of ``support`` (None: not available)."""
    if isinstance(q, Constrained):
        chain = normal_chain(q)
        return None if chain is None else chain[0]
    try:
        value = biject_to(support).inv(q.mean)
    except Exception:  # noqa: BLE001 - no mean, or a support without a bijection: no claim
        return None
    # numpy: the value is concrete, and jnp's ops outside a program compile one each
    return value if bool(np.all(np.isfinite(np.asarray(value)))) else None
