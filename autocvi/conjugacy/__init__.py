"""Automatic conjugacy detection by abstract interpretation of jaxprs.

``classify_edge(site_fn, values, target, family)`` decides whether a factor's log
density, as a function of one latent, is affine in the sufficient statistics of
that latent's variational family, and says why (see :class:`EdgeVerdict`).
"""

from .verdict import FAMILIES, EdgeVerdict, analyse_function, classify_edge

__all__ = ["FAMILIES", "EdgeVerdict", "analyse_function", "classify_edge"]
