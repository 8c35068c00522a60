"""What CVI maximises: the ELBO, the beta-ELBO, or a direct-loss (DLM) objective.

Every objective here has the shape of Wei, Sheth & Khardon, *Direct Loss
Minimization for Sparse Gaussian Processes* (AISTATS 2021), Sec. 1-2:

    minimise   sum_n loss_n(q) + beta KL(q || p)

with, for an observation y_n whose likelihood reads a Gaussian predictor
f_n ~ N(m_n, v_n) under q,

* ELBO (beta = 1) and beta-ELBO: ``loss_n = -E_q[log p(y_n | f_n)]``;
* log-loss DLM: ``loss_n = -log E_q[p(y_n | f_n)] = -log q(y_n)``, the log loss of
  the predictive distribution the user will be scored with;
* square-loss DLM: ``loss_n = (y_hat_n - y_n)^2 / 2``, the square error of the
  predictive mean (Gaussian likelihoods).

autocvi maximises the equivalent ``sum_n r_n(q) / beta - KL(q || p)`` with the reward
``r_n = -loss_n``: the same optimum, and the form CVI's natural-gradient step takes
(Khan & Lin, *Conjugate-Computation Variational Inference*, Alg. 1: the
site of element n is the gradient of ``r_n / beta`` with respect to the mean
parameters ``(m_n, m_n^2 + v_n)`` of its predictor, whatever ``r_n`` is; the DESIGN
note's "replace the expected log-likelihood by the loss and keep the
natural-gradient update").

The reward of an element is computed by :meth:`Objective.expected`, a pure function of
the element's log likelihood ``l(f)`` and its predictor's mean and variance:

* ``E[l(f)]`` by 32-node Gauss-Hermite (exact for polynomial ``l`` of degree < 64);
* ``log E[exp l(f)]`` by *adaptive* Gauss-Hermite: the rule is centred on the mode of
  ``l(f) + log N(f | m, v)`` and scaled by its curvature (Newton steps), so it is exact
  to rounding for a Gaussian likelihood (``log N(y | m, v + s^2)``, however narrow
  the likelihood is against q) and close to it for any smooth log-concave one. The DLM
  paper estimates this term by sampling (bMC, uPS) because its gradients are wanted
  for any q; for the one-dimensional predictors autocvi reads, quadrature is exact
  where the paper's closed forms exist and deterministic where they do not.

A factor's whole log density is multiplied by :attr:`Objective.likelihood_scale`
before any message is computed (``1 / beta`` for the beta-ELBO, which keeps exact
conjugate messages exact); DLM divides the log expectation by beta instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from .dlm_estimators import bmc_gradient, smooth_bmc_gradient, ups_gradient
from .expectations import GH_NODES, GH_WEIGHTS

__all__ = ["Objective", "ELBO", "BetaELBO", "DLM", "as_objective", "log_expected_likelihood"]


def expected_log_likelihood(rest: Callable, mean, var, key=None):
    """``E_{N(f | mean, var)}[rest(f)]`` per element by 32-node Gauss-Hermite.

    ``rest`` maps predictors of ``mean``'s shape to per-element log densities of the
    same shape (element n reads predictor n only); ``var >= 0``. ``key`` is unused
    (the signature of :meth:`Objective.expected`). Differentiable in ``mean`` and
    ``var`` (:func:`_gauss_hermite`'s rule).
    """
    return _gauss_hermite(rest, mean, var)


def _gh_predictors(mean, var):
    nodes = jnp.asarray(GH_NODES, mean.dtype).reshape((-1,) + (1,) * mean.ndim)
    sd = jnp.sqrt(jnp.maximum(var, 0.0))
    return nodes, sd, mean[None] + sd[None] * nodes


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _gauss_hermite(rest, mean, var):
    _, _, eta = _gh_predictors(mean, var)
    return _node_sums(jnp.asarray(GH_WEIGHTS, mean.dtype)[None], jax.vmap(rest)(eta))[0]


def _node_sums(rows, at_nodes):
    """``rows @ at_nodes`` over the node axis: (R, K) x (K, ...) -> (R, ...).

    A matrix, not a vector, on the left even for one row: XLA on the CPU runs a
    (1, K) x (K, N) product as a matrix product, where a vector-times-matrix ran as a
    loop at about twice the cost (the Gauss-Hermite rule 0.10 -> 0.05 ms on logistic
    regression, N = 683, K = 32).
    """
    return jnp.tensordot(rows, at_nodes, axes=1)


@_gauss_hermite.defjvp
def _gauss_hermite_jvp(rest, primals, tangents):
    """The derivatives of every element's expectation from one forward pass.

    Element n reads predictor n only, so the Jacobian of ``rest`` is diagonal and one
    forward-mode product with a vector of ones gives every ``l_n'`` at every node.
    Then ``dE_n/dm_n = E[l_n'(f)]`` and ``dE_n/dv_n = E[l_n'(f) x] / (2 sqrt(v_n))``
    (differentiating ``f = m + sqrt(v) x`` at the nodes, as reverse mode would),
    without reverse mode's transposes and stored intermediates: a Gaussian block's
    step, whose cost is this pass, ran 0.13 -> 0.10 ms on logistic regression
    (N = 683). The rule is linear in the tangents, so reverse mode transposes it.
    """
    mean, var = primals
    dmean, dvar = tangents
    nodes, sd, eta = _gh_predictors(mean, var)
    weights = jnp.asarray(GH_WEIGHTS, mean.dtype)

    def with_slope(e):
        return jax.jvp(rest, (e,), (jnp.ones_like(e),))

    values, slopes = jax.vmap(with_slope)(eta)
    d_mean, d_node = _node_sums(jnp.stack([weights, weights * nodes.reshape(-1)]), slopes)
    # d sqrt(max(v, 0)) / dv as autodiff has it: 0 where v < 0 (non-finite at v = 0,
    # where the caller's finiteness checks keep the old site).
    d_sd = jnp.where(var >= 0.0, 0.5 / sd, 0.0)
    return _node_sums(weights[None], values)[0], d_mean * dmean + d_node * d_sd * dvar


# log w_k - log phi(x_k): the standard-normal rule turned into one for Lebesgue measure
# (int g(z) dz = sum_k w_k g(x_k) / phi(x_k)), kept in logs: the outer nodes' weights
# are ~1e-60 and their 1 / phi ~1e60.
_LOG_LEBESGUE_WEIGHTS = np.log(GH_WEIGHTS) + 0.5 * GH_NODES**2 + 0.5 * np.log(2.0 * np.pi)

# Newton steps to the mode of l(f) + log N(f | m, v) (each exact for a quadratic l, within
# a trust region of one q-sd): at most this many, stopping once no element's mode moves by
# more than sqrt(eps) relative. Six fixed, unbounded steps left a Poisson count of 40 under
# a broad q far from its mode (the value was -1.6e67 against scipy's -7.49), and on the
# counts of benchmarks/dlm_nonconjugate.py the rule's value depended on its centre, which
# its gradient does not see: the gradient pointed the wrong way, and DLM fits stalled 4-11
# nats short of the optimum, saying they had converged.
_MAX_NEWTON_STEPS = 60


def log_expected_likelihood(rest: Callable, mean, var):
    """``log E_{N(f | mean, var)}[exp rest(f)]`` per element, by adaptive Gauss-Hermite.

    The integrand ``g(f) = exp(rest(f)) N(f | mean, var)`` is written around its mode
    ``f*`` with scale ``s = (1 / var - rest''(f*))^(-1/2)`` (``rest''`` clipped at 0, so
    ``s^2 <= var``): ``log int g = log s + logsumexp_k [log w_k - log phi(x_k) +
    log g(f* + s x_k)]``. For a Gaussian ``rest`` the summand is constant in k and the
    result exact; the mode is found by Newton steps on ``log g`` (concave where
    ``rest`` is). Differentiable in ``mean`` and ``var`` (the DLM site's gradients).
    """
    dtype = mean.dtype
    var = jnp.maximum(var, jnp.finfo(dtype).tiny)

    def total(f):
        return jnp.sum(rest(f))

    def derivatives(f):
        g1, g2 = jax.jvp(jax.grad(total), (f,), (jnp.ones_like(f),))
        return g1, g2

    centre, spread = jax.lax.stop_gradient(mean), jax.lax.stop_gradient(var)
    tol = float(np.sqrt(np.finfo(dtype).eps))
    reach = jnp.maximum(jnp.sqrt(spread), 1.0)

    def newton(carry):
        f, k, _ = carry
        g1, g2 = derivatives(f)
        slope = g1 - (f - centre) / spread
        curvature = jnp.minimum(g2, 0.0) - 1.0 / spread
        # A trust region of one q-sd (at least 1): from far in q's tail Newton's first
        # step overshoots an exp-like likelihood by hundreds (a count of 40 from f = -2:
        # to f = 160), and each step back then moves by about 1.
        step = jnp.clip(-slope / curvature, -reach, reach)
        f_new = jnp.where(jnp.isfinite(step), f + step, f)
        return f_new, k + 1, jnp.any(jnp.abs(f_new - f) > tol * (1.0 + jnp.abs(f)))

    # The mode moves with (mean, var); the rule is valid at any centre and scale, so
    # the Newton iterates are not differentiated: at the mode, the rule's value does not
    # change to first order with its centre, and the integrand at the nodes carries the
    # gradient. That holds only at the mode: iterate until it is found.
    f_star, _, _ = jax.lax.while_loop(
        lambda c: (c[1] < _MAX_NEWTON_STEPS) & c[2],
        newton,
        (centre, jnp.zeros((), jnp.int32), jnp.asarray(True)),
    )
    f_star = jax.lax.stop_gradient(f_star)
    _, g2 = derivatives(f_star)
    scale = jax.lax.stop_gradient(jnp.sqrt(1.0 / (1.0 / var - jnp.minimum(g2, 0.0))))
    nodes = jnp.asarray(GH_NODES, dtype).reshape((-1,) + (1,) * mean.ndim)
    f = f_star[None] + scale[None] * nodes
    log_prior = -0.5 * (f - mean) ** 2 / var - 0.5 * jnp.log(2.0 * jnp.pi * var)
    log_g = jax.vmap(rest)(f) + log_prior
    log_w = jnp.asarray(_LOG_LEBESGUE_WEIGHTS, dtype).reshape(nodes.shape)
    return jnp.log(scale) + jax.scipy.special.logsumexp(log_w + log_g, axis=0)


@dataclass(frozen=True)
class Objective:
    """Base of the objectives: ``sum_n r_n / beta - KL(q || p)``, maximised.

    ``beta > 0`` weighs the KL term against the data (DLM paper, Sec. 1).
    """

    beta: float = 1.0

    def __post_init__(self):
        if not (np.isfinite(self.beta) and self.beta > 0):
            raise ValueError(f"{type(self).__name__}: beta must be positive, got {self.beta!r}")
        # beta as an array the compiled step closes over: autocvi.jaxpr.structural_jit
        # lifts it out as an input, so a fit at another beta reuses the compiled program
        # (a Python float would be a literal of the program, and every beta of a grid
        # would compile its own).
        object.__setattr__(self, "beta_input", jnp.asarray(float(self.beta)))

    #: Multiplies every likelihood factor's log density before messages are computed
    #: (None: left as it is).
    @property
    def likelihood_scale(self) -> float | None:
        return None

    #: Whether a likelihood's exact conjugate messages stay valid (the reward is an
    #: expectation of the log density, affine in q's statistics).
    expectation_of_log_density = True

    def expected(self, rest: Callable, mean, var, key=None):
        """The reward of each element (already divided by beta where it applies).

        ``key``: random numbers for an objective whose gradient is estimated by
        sampling (the engine passes one where it takes the gradient for a message;
        without it the value and gradient are deterministic).
        """
        return expected_log_likelihood(rest, mean, var)

    @property
    def is_elbo(self) -> bool:
        return False

    #: Whether the reward reads the predictor's mean only (not its variance).
    reward_reads_mean_only = False

    #: Whether messages' gradients are sampling estimates (not ascent directions
    #: for sure: the line search may refuse them, and the run's diagnostics count that).
    sampled_gradients = False

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class ELBO(Objective):
    """The evidence lower bound, ``E_q[log p(y | f)] - KL(q || p)`` (the default)."""

    @property
    def is_elbo(self) -> bool:
        return True

    def describe(self) -> str:
        return "ELBO"


@dataclass(frozen=True)
class BetaELBO(Objective):
    """``E_q[log p(y | f)] - beta KL(q || p)``: the KL weighted by beta (DLM paper, Sec. 1).

    Equivalent to the ELBO of the likelihood tempered by ``1 / beta``: every likelihood
    factor's log density is divided by beta, so conjugate messages stay exact. With a
    Gaussian likelihood and prior the optimum is the exact posterior of the tempered
    model; ``BetaELBO(1)`` is the ELBO.
    """

    @property
    def likelihood_scale(self) -> float:
        return 1.0 / self.beta

    def describe(self) -> str:
        return f"beta-ELBO (beta = {self.beta:g})"


def _log_loss_reward(objective, rest, mean, var):
    return log_expected_likelihood(rest, mean, var) / objective.beta_input


def square_loss_reward(objective, rest, mean, var):
    """``-(y_hat_n - y_n)^2 / (2 beta)``: the square loss of the predictive mean
    ``y_hat_n`` of a Gaussian likelihood ``N(y_n | mu_n, s_n^2)`` whose mean ``mu_n`` is
    affine in the predictor (DLM paper, Sec. 3, "square loss DLM": ``1/2 sum_n
    (y_hat_n - y_n)^2 + beta KL``); ``y_hat_n = mu_n(m_n)``.

    The predictor the analysis reads may be any affine function of ``mu_n`` (the
    standardised ``(mu_n - y_n) / s_n``, say), so the residual is read from the log
    likelihood ``l`` itself, in the units of y: ``l`` is quadratic, its maximum is
    ``l_max = l(m) - l'(m)^2 / (2 l''(m)) = -log s - log(2 pi) / 2`` (the Normal's
    normalising constant, so ``s^2 = exp(-2 l_max) / (2 pi)``) and
    ``(y_hat - y)^2 = -2 s^2 (l(m) - l_max) = s^2 l'(m)^2 / -l''(m)``. Derivatives by
    autodiff (no cancellation for any s). Elements whose ``l`` has no curvature
    (masked observations) contribute 0. The reward does not read ``var``: the optimal
    q keeps the prior's covariance, and its mean is the posterior mean under Gaussian
    noise of variance ``beta`` (in y's units).
    """
    del var

    def slope(f):
        return jax.grad(lambda e: jnp.sum(rest(e)))(f)

    d1, d2 = jax.jvp(slope, (mean,), (jnp.ones_like(mean),))
    curved = d2 < 0
    safe = jnp.where(curved, d2, -1.0)
    excess = 0.5 * d1**2 / -safe  # l_max - l(m) >= 0
    log_s2 = -2.0 * (rest(mean) + excess) - jnp.log(2.0 * jnp.pi)
    return jnp.where(curved, -jnp.exp(log_s2) * excess / objective.beta_input, 0.0)


# The DLM losses autocvi computes: name -> reward per element (the negative loss).
DLM_LOSSES: dict[str, Callable] = {"log": _log_loss_reward, "square": square_loss_reward}
# Losses whose reward reads the predictor's mean only: their CVI sites carry no
# precision, so a Gaussian block steps them by Newton on the mean (GaussianBlock.update),
# and only Gaussian likelihoods (a quadratic l) are accepted.
MEAN_ONLY_LOSSES = frozenset({"square"})

# How the log-loss reward's gradient is obtained: None is by differentiating the
# adaptive Gauss-Hermite value; the others are the paper's sampling estimators
# (autocvi.analysis.dlm_estimators), each (rest, mean, var, key, L, dlm) -> (d/dm, d/dv).
DLM_GRADIENTS: dict[str, Callable | None] = {
    "quadrature": None,
    "bmc": lambda rest, m, v, key, dlm: bmc_gradient(rest, m, v, key, dlm.num_samples),
    "smooth-bmc": lambda rest, m, v, key, dlm: smooth_bmc_gradient(
        rest, m, v, key, dlm.num_samples, dlm.smoothing
    ),
    "ups": lambda rest, m, v, key, dlm: ups_gradient(rest, m, v, key, dlm.num_samples),
}


@dataclass(frozen=True)
class DLM(Objective):
    """Direct loss minimisation: ``sum_n loss_n(q) + beta KL(q || p)`` minimised.

    ``loss="log"``: ``loss_n = -log E_q[p(y_n | f_n)]``, the log loss of q's
    predictive distribution (DLM paper, Sec. 1, "LogLoss DLM objective"). The term is
    computed by adaptive Gauss-Hermite quadrature over the element's scalar predictor
    (exact for a Gaussian likelihood), so each likelihood must read its Gaussian
    latents through one scalar linear predictor per observation; ``plan()`` says which
    factors do and refuses the others by name.

    ``gradient``: how the messages' gradients of that term are obtained:
    ``"quadrature"`` (default: the derivative of the quadrature, deterministic), or the
    paper's estimators with ``num_samples`` draws per element and step, ``"bmc"``,
    ``"smooth-bmc"`` (``smoothing`` is its nu) and ``"ups"``
    (:mod:`autocvi.analysis.dlm_estimators`). The objective's value (the line
    search's and the reported one) is the quadrature's with every choice.

    ``loss="square"``: ``loss_n = (y_hat_n - y_n)^2 / 2`` with ``y_hat_n`` the predictive
    mean (:func:`square_loss_reward`; DLM paper, Sec. 3), for Gaussian likelihoods whose
    latents form a Gaussian block. Its optimum has a closed form (the prior's
    covariance; the posterior mean under noise variance beta), which the block's
    Newton step on the mean reaches in one iteration.
    """

    loss: str = "log"
    gradient: str = "quadrature"
    num_samples: int = 10
    smoothing: float = 1e-4

    def __post_init__(self):
        super().__post_init__()
        if self.loss not in DLM_LOSSES:
            raise ValueError(
                f"DLM(loss={self.loss!r}) is not available; losses: {sorted(DLM_LOSSES)}"
            )
        if self.loss in MEAN_ONLY_LOSSES and self.gradient != "quadrature":
            raise ValueError(
                f"DLM(loss={self.loss!r}) has a closed-form gradient; the sampling "
                f"estimators (gradient={self.gradient!r}) are for the log loss"
            )
        if self.gradient not in DLM_GRADIENTS:
            raise ValueError(
                f"DLM(gradient={self.gradient!r}) is not available; choose one of "
                f"{sorted(DLM_GRADIENTS)}"
            )
        if int(self.num_samples) < 1 or not self.smoothing >= 0:
            raise ValueError(
                f"DLM: num_samples must be >= 1 and smoothing >= 0, got "
                f"{self.num_samples!r} and {self.smoothing!r}"
            )

    expectation_of_log_density = False

    @property
    def reward_reads_mean_only(self) -> bool:
        return self.loss in MEAN_ONLY_LOSSES

    @property
    def sampled_gradients(self) -> bool:
        return self.gradient != "quadrature"

    def expected(self, rest: Callable, mean, var, key=None):
        value = DLM_LOSSES[self.loss](self, rest, mean, var)
        estimator = DLM_GRADIENTS[self.gradient]
        if estimator is None or key is None:
            return value
        # The value stays the quadrature's; the gradient w.r.t. (mean, var) is the
        # estimator's (a surrogate whose derivative is the estimate).
        stop = jax.lax.stop_gradient
        gm, gv = estimator(rest, stop(mean), stop(var), key, self)
        gm, gv = stop(gm), stop(gv)
        return stop(value) + (gm * (mean - stop(mean)) + gv * (var - stop(var))) / self.beta_input

    def describe(self) -> str:
        how = (
            ""
            if self.gradient == "quadrature"
            else f", {self.gradient} gradients, L = {self.num_samples}"
        )
        return f"DLM, {self.loss} loss (beta = {self.beta:g}{how})"


def as_objective(objective=None) -> Objective:
    """``objective`` as an :class:`Objective` (None: the ELBO); anything else raises."""
    if objective is None:
        return ELBO()
    if isinstance(objective, Objective):
        return objective
    if isinstance(objective, type) and issubclass(objective, Objective):
        return objective()
    raise TypeError(
        f"objective must be autocvi.ELBO(), autocvi.BetaELBO(beta) or autocvi.DLM(...), "
        f"got {objective!r}"
    )
