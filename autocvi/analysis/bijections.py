"""The maps from a latent's unconstrained coordinates to its support, in the working
precision's safe range.

``biject_to(support)`` is NumPyro's choice of map, and autocvi keeps it except where
its arithmetic breaks in float32 (the precision users get by default). One entry so far,
the simplex: NumPyro's stick-breaking takes ``cumprod(1 - sigmoid(x))``, which is 0 as
soon as one stick's ``sigmoid`` rounds to 1 (``x`` above about 17 in float32), and
underflows to exactly 0 for a small weight. A Dirichlet prior with concentration below
1 puts its posterior mass on such weights (a mixture component with no data under
``Dirichlet(0.2)``): the prior's log density ``(alpha - 1) log w`` and the map's
log-Jacobian ``sum log w`` were then infinite at q's draws and at the start, and the
fit never moved. :class:`LogSpaceStickBreaking` computes ``log w`` from ``x`` with
``log_sigmoid`` only, so the log-Jacobian is finite for every ``x``, and the weights are
``exp(log w)`` held at or above the smallest normal number (the prior's log density at
them stays finite; the sum differs from 1 by at most K times that number).

Stan's simplex transform (Stan Reference Manual, "Unit simplex") is the same
stick-breaking map; its log-Jacobian ``sum_k log y_k + log sigmoid(x_k) - x_k`` is
evaluated here with ``log y_k`` in closed form.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.nn import log_sigmoid
from numpyro.distributions.transforms import StickBreakingTransform, biject_to

__all__ = ["LogSpaceStickBreaking", "unconstraining_map"]


class LogSpaceStickBreaking(StickBreakingTransform):
    """NumPyro's :class:`StickBreakingTransform` (the same map, domain, codomain and
    inverse) with its forward map and log-Jacobian computed from ``log w``."""

    @staticmethod
    def _shifted(x):
        # NumPyro's shift: x = 0 maps to the simplex's centre (1/K, ..., 1/K).
        return x - jnp.log(x.shape[-1] - jnp.arange(x.shape[-1], dtype=x.dtype))

    def log_weights(self, x):
        """``log w`` (K values) for the K - 1 coordinates ``x``: stick k takes
        ``sigmoid(x_k)`` of what the sticks before it left, ``prod_{j<k} sigmoid(-x_j)``."""
        s = self._shifted(x)
        left = jnp.cumsum(log_sigmoid(-s), axis=-1)
        zero = jnp.zeros_like(s[..., :1])
        taken = jnp.concatenate([log_sigmoid(s), zero], axis=-1)
        return taken + jnp.concatenate([zero, left], axis=-1)

    def __call__(self, x):
        # After exp: a result below the smallest normal number may be flushed to 0.
        return jnp.maximum(jnp.exp(self.log_weights(x)), jnp.finfo(jnp.result_type(x)).tiny)

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        s = self._shifted(x)
        return jnp.sum(self.log_weights(x)[..., :-1] + log_sigmoid(s) - s, axis=-1)


# NumPyro's map -> the one autocvi uses in its place (a subclass: same domain and inverse).
_SAFER = {StickBreakingTransform: LogSpaceStickBreaking}


def unconstraining_map(support):
    """``biject_to(support)``, or its replacement in :data:`_SAFER` (module docstring)."""
    transform = biject_to(support)
    safer = _SAFER.get(type(transform))
    return transform if safer is None else safer()
