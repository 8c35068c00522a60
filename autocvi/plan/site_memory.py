"""Per-element sites for the messages of subsampled factors (variance-reduced minibatches).

A factor in a subsampled plate that reads a global Gaussian ``u`` only through a
linear predictor ``eta_n = a_n^T u + b_n`` sends ``u`` a sum of one Gaussian site per
plate element, ``exp(c1_n eta_n + c2_n eta_n^2)`` (t-SVGP, Adam et al. 2021, Eq. 9).
The plain minibatch message is ``N/B`` times the batch's sites: t-SVGP's tied sites
(their Eqs. 20-24), unbiased but noisy at every q, so its steps must decay. Keeping
the last sites of every element (``2 N`` numbers, the O(N) memory of PG-SVI's GP
update, Khan et al. 2016, Eq. 19) and their running sum gives the SAG estimate of the
full-data message (Schmidt, Le Roux & Bach 2017): the batch's sites are refreshed at
the current q and

    g = (N / n_seen) sum_{n seen} s_n,

the sum of every element's last site (scaled by N over the elements seen until the
first pass is complete). Stale sites bias it while q moves; at the fixed point every
site is current and the estimate is the full-data message, so the fit reaches the
full-batch fixed point with a constant step instead of hovering around it. For a
log-concave likelihood every site has non-positive curvature and so does the sum:
the estimate is always a valid Gaussian message. (SAGA's unbiased variant adds
``(N/B) (s_n(q) - s_n)``, a difference of a fresh and a stale site that need not be:
on a Poisson GLM it threw q to w = -19 in the second pass.) The engine keeps the
memory (``CVIState.sites``); this module decides where it applies.

A log-loss DLM reward ``r_n = log E_q[p(y_n | f_n)] / beta`` (Wei, Sheth & Khardon,
*Direct Loss Minimization for Sparse Gaussian Processes*, Sec. 4) is held differently
(``SiteMemory.gradients``): a site extrapolates its element's gradient linearly in the
predictor with slope ``2 dr/dv``, which for the log loss is not the gradient's slope and
has the wrong sign for a misclassified point (``dr/dv > 0``); held as sites, the memory
threw a logistic regression's mean to 1e9 within ten steps. The memory keeps each
element's last ``(dr_n/dm_n, dr_n/dv_n)`` and its curvature ``max(-d^2 r_n/dm_n^2, 0)``
instead, and the node (a Newton step on its mean, ``autocvi.engine.step``) reads SAGA's
estimate of the full-data gradient (Defazio, Bach & Lacoste-Julien 2014), ``sum_n g_n +
(N/B) sum_{batch} (g_n(q) - g_n)``, unbiased at every q, and the stored curvatures' sum.
Its first pass, while the memory fills, takes plain N/B-scaled minibatch steps with
decaying sizes; then the step is held (``Schedule.step_size_at``). Measured: a logistic
regression with B = N / 4 reaches the full-data optimum to 0.001 sd (0.15 sd without the
memory, which stopped on its noise); an SVGP on 100,000 points (B = 1,000) at beta = 10
reaches a higher full-data objective than Adam's instead of drifting away from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax

from ..analysis.objectives import expected_log_likelihood
from ..model.graph import PlateInfo
from ..model.message_kinds import CUBATURE, GAUSS_HERMITE

__all__ = ["SiteMemory", "find_site_memory"]


@dataclass(frozen=True)
class SiteMemory:
    """The message of ``factor`` to ``node`` is kept as one site per element of ``plate``."""

    factor: str
    node: str
    plate: PlateInfo
    # The message kind whose sites are held: Gauss-Hermite sites are scalars
    # ``(c1_n, c2_n)``; a vector predictor's (cubature) are ``c1_n`` in R^K and
    # ``C2_n`` in R^{K x K}, ``exp(c1_n^T eta_n + eta_n^T C2_n eta_n)``.
    kind: str = GAUSS_HERMITE.name
    # ``()`` for scalar sites, ``(K,)`` for a K-vector predictor's.
    event_shape: tuple = ()
    # Each element's last gradients and curvature instead of its site: a log-loss DLM
    # reward (see the module's docstring).
    gradients: bool = False

    def describe(self) -> str:
        k = self.event_shape[0] if self.event_shape else 1
        numbers = (
            f"2 x {self.plate.size}"
            if not self.event_shape
            else f"({k} + {k}^2) x {self.plate.size}"
        )
        if self.gradients:
            return (
                f"{self.factor} -> {self.node}: one gradient and curvature per element of "
                f"{self.plate} held in memory (3 x {self.plate.size} numbers; SAGA estimate "
                "of the full-data gradient, steps decaying in the first pass and then held; "
                "site_memory=False sends N/B-scaled minibatch messages instead)"
            )
        return (
            f"{self.factor} -> {self.node}: one site per element of {self.plate} held in "
            f"memory ({numbers} numbers; SAG estimate of the full-data "
            "message, constant step; site_memory=False sends N/B-scaled minibatch "
            "messages instead)"
        )


def find_site_memory(schedule, example: dict) -> tuple:
    """The (factor, node) messages that qualify: a Gauss-Hermite (or, for a K-vector
    predictor, cubature) message to a whole-site
    Gaussian (one vector, not a Gaussian block) from a factor in one subsampled plate
    whose only latent is the node, that reads no learned param (the M-step would have to
    map every element's site through the new predictor: a pass over all the data), and
    whose predictor has one element per sampled plate element."""
    found = []
    for name, node in schedule.nodes.items():
        lay = node.layout
        if name in schedule.blocks or node.local or lay.q_family != "MultivariateNormal":
            continue
        if lay.plate_ndim != 0:
            continue
        for fname, kind in node.incoming:
            fplan = schedule.factors[fname]
            if kind not in (GAUSS_HERMITE.name, CUBATURE.name) or fplan.latents != (name,):
                continue
            if len(fplan.subsampled) != 1 or name not in fplan.linear_predictors:
                continue
            factor = schedule.graph.factors.get(fname)
            if factor is None or set(factor.params) & set(schedule.learned):
                continue
            # A DLM reward: held as gradients, for the Newton step on a log loss only.
            gradients = fplan.expected is not expected_log_likelihood
            if gradients and (
                kind != GAUSS_HERMITE.name
                or fplan.sampled_gradients
                or fplan.reward_reads_mean_only
            ):
                continue
            (plate,) = fplan.subsampled
            lp = fplan.linear_predictors[name]
            shape = jax.eval_shape(lp.eta_fn, example).shape
            event = () if lp.vector_size is None else (lp.vector_size,)
            if shape != (plate.subsample_size, *event):
                continue
            found.append(SiteMemory(fname, name, plate, kind, event, gradients))
    return tuple(found)
