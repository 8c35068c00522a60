"""Automatic conjugacy detection by abstract interpretation of jaxprs.

``classify_edge(site_fn, values, target, family)`` decides whether a factor's
log density, as a function of one latent, is affine in the sufficient
statistics of that latent's variational family, and says why
(:class:`EdgeVerdict`); ``analyse_function(fn, values, target, family)`` does the
same for a plain JAX function (``numpyro.factor``).

How (see :mod:`.interpreter` and :mod:`.algebra`): the jaxpr of the factor is
walked once, every intermediate getting an abstract value -- constant, a
polynomial in the atoms ``z^a``, ``(1-z)^b``, ``log z``, ``log(1-z)``,
``indicator(z)`` with numeric coefficient arrays (vectorised over plate
elements), or OPAQUE with the primitive that caused it.  Guards (comparisons,
``select_n``, ``max``/``min``/``clamp``/``abs``, ``argmax``...) are resolved
concretely at a few valid draws of the target spanning its support: a guard
identical at every draw takes that branch; otherwise the analysis is re-run once
per draw and accepted only if every run gives the same polynomial.  Calls
(``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``, ``cond``) are
entered.  Verdicts:

* Normal (elementwise): monomials in {1, z, z^2}, each product on a single element;
* MultivariateNormal (the last axis is one event, leading axes are plates):
  {1, z, z z^T} with cross products only within an event row;
* Gamma: {1, z, log z}; Beta: {1, log z, log(1-z)}; Dirichlet: {1, log z};
* Categorical / Bernoulli: every function of a discrete z is affine in its one-hot
  indicator, so the edge is conjugate unless the log density couples several
  elements of z non-additively (e.g. ``log(1 + sum(z == 0))`` or a pairwise
  ``A[z[:-1], z[1:]]``) or the example values are not integers;
* Unconstrained: never conjugate.

A conjugate verdict is re-checked at other values of the other latents (a
coefficient that vanishes at the example, e.g. a discrete switch at 0, must not
hide a monomial) and, for exactly tracked coefficients, numerically against the
log density at the draws.  Any doubt gives "non-conjugate" with the reason.
"""

from .verdict import FAMILIES, EdgeVerdict, analyse_function, classify_edge

__all__ = ["FAMILIES", "EdgeVerdict", "analyse_function", "classify_edge"]
