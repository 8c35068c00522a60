"""Tests of ``autocvi.families`` against numpyro and closed forms (never against our own outputs).

Every case builds a numpyro distribution from random parameters together with
the natural and mean parameters written out independently from the layouts in
``docs/internals.md`` (with numpy/scipy), then checks the family's functions
against them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import special as sps
from scipy import stats

from autocvi.families import (
    FAMILIES,
    Bernoulli,
    Beta,
    Categorical,
    Dirichlet,
    Gamma,
    InverseGamma,
    MultivariateNormal,
    Normal,
    family_for_distribution,
    natural_from_prior,
)

pytestmark = pytest.mark.float64

SETTINGS = settings(max_examples=25, deadline=None)
NAMES = list(FAMILIES)
# Number of trailing axes of each sufficient statistic beyond the batch axes.
STAT_NDIMS = {
    "Normal": (0, 0),
    "MultivariateNormal": (1, 2),
    "Gamma": (0, 0),
    "InverseGamma": (0, 0),
    "Beta": (0, 0),
    "Dirichlet": (1,),
    "Categorical": (1,),
    "Bernoulli": (0,),
}
K_CAT = 4


def floats(lo, hi, shape):
    return hnp.arrays(np.float64, shape, elements=st.floats(lo, hi, allow_nan=False))


# ---------------------------------------------------------------- cases
# A case is random parameters (numpy arrays), from which we write out by hand
# (numpy/scipy) the natural and mean parameters of docs/internals.md and draw
# values z with numpy's generators.  numpyro sees only the parameters.


class Case:
    def __init__(self, family, params, lam, mu, z, batch, event):
        self.family, self.params, self.batch, self.event = family, params, batch, event
        self.lam = tuple(np.asarray(x, dtype=np.float64) for x in lam)
        self.mu = tuple(np.asarray(x, dtype=np.float64) for x in mu)
        self.z = z

    @property
    def d(self):
        return MAKE_DIST[self.family.name](*self.params)


def _rng(*arrays):
    seed = abs(hash(tuple(np.asarray(a).tobytes() for a in arrays))) % 2**32
    return np.random.default_rng(seed)


def normal_case(loc, scale):
    v = scale**2
    z = _rng(loc, scale).normal(loc, scale, (5,) + loc.shape)
    return Case(Normal, (loc, scale), (loc / v, -0.5 / v), (loc, loc**2 + v), z, loc.shape, ())


def mvn_case(loc, diag, off):
    d = loc.shape[-1]
    tril = np.tril(off, -1) + np.einsum("...i,ij->...ij", np.exp(diag), np.eye(d))
    cov = tril @ np.swapaxes(tril, -1, -2)
    prec = np.linalg.inv(cov)
    lam = (np.einsum("...ij,...j->...i", prec, loc), -0.5 * prec)
    mu = (loc, cov + loc[..., :, None] * loc[..., None, :])
    eps = _rng(loc, diag, off).normal(size=(5,) + loc.shape)
    z = loc + np.einsum("...ij,...j->...i", tril, eps)
    return Case(MultivariateNormal, (loc, tril), lam, mu, z, loc.shape[:-1], (d,))


def gamma_case(a, b):
    mu = (sps.digamma(a) - np.log(b), a / b)
    z = _rng(a, b).gamma(a, 1 / b, (5,) + a.shape)
    return Case(Gamma, (a, b), (a - 1, -b), mu, z, a.shape, ())


def inverse_gamma_case(a, b):
    mu = (np.log(b) - sps.digamma(a), a / b)
    z = 1.0 / _rng(a, b).gamma(a, 1 / b, (5,) + a.shape)
    return Case(InverseGamma, (a, b), (-a - 1, -b), mu, z, a.shape, ())


def beta_case(a, b):
    mu = (sps.digamma(a) - sps.digamma(a + b), sps.digamma(b) - sps.digamma(a + b))
    z = np.clip(_rng(a, b).beta(a, b, (5,) + a.shape), 1e-300, 1 - 1e-16)
    return Case(Beta, (a, b), (a - 1, b - 1), mu, z, a.shape, ())


def dirichlet_case(alpha):
    mu = (sps.digamma(alpha) - sps.digamma(alpha.sum(-1, keepdims=True)),)
    rng = _rng(alpha)
    z = np.stack([np.stack([rng.dirichlet(a) for a in alpha]) for _ in range(5)])
    z = np.maximum(z, 1e-300)
    z = z / z.sum(-1, keepdims=True)
    return Case(Dirichlet, (alpha,), (alpha - 1,), mu, z, alpha.shape[:-1], alpha.shape[-1:])


def categorical_case(logits):
    probs = sps.softmax(logits, axis=-1)
    rng = _rng(logits)
    z = np.array([[rng.choice(K_CAT, p=p) for p in probs] for _ in range(5)])
    return Case(Categorical, (logits,), (logits,), (probs,), z, logits.shape[:-1], ())


def bernoulli_case(logits):
    p = sps.expit(logits)
    z = (_rng(logits).uniform(size=(5,) + logits.shape) < p).astype(np.int32)
    return Case(Bernoulli, (logits,), (logits,), (p,), z, logits.shape, ())


MAKE_DIST = {
    "Normal": dist.Normal,
    "MultivariateNormal": lambda loc, tril: dist.MultivariateNormal(loc, scale_tril=tril),
    "Gamma": dist.Gamma,
    "InverseGamma": dist.InverseGamma,
    "Beta": dist.Beta,
    "Dirichlet": dist.Dirichlet,
    "Categorical": lambda logits: dist.Categorical(logits=logits),
    "Bernoulli": lambda logits: dist.Bernoulli(logits=logits),
}

STRATEGIES = {
    "Normal": st.builds(normal_case, floats(-5, 5, (3,)), floats(0.1, 5, (3,))),
    "MultivariateNormal": st.builds(
        mvn_case, floats(-3, 3, (2, 3)), floats(-1, 1, (2, 3)), floats(-1, 1, (2, 3, 3))
    ),
    "Gamma": st.builds(gamma_case, floats(0.1, 20, (3,)), floats(0.1, 10, (3,))),
    "InverseGamma": st.builds(inverse_gamma_case, floats(0.1, 20, (3,)), floats(0.1, 10, (3,))),
    "Beta": st.builds(beta_case, floats(0.1, 20, (3,)), floats(0.1, 20, (3,))),
    "Dirichlet": st.builds(dirichlet_case, floats(0.1, 20, (2, 3))),
    "Categorical": st.builds(categorical_case, floats(-5, 5, (3, K_CAT))),
    "Bernoulli": st.builds(bernoulli_case, floats(-6, 6, (3,))),
}

FIXED = {
    "Normal": lambda: normal_case(np.array([-1.0, 0.5, 3.0]), np.array([0.5, 1.0, 2.0])),
    "MultivariateNormal": lambda: mvn_case(
        np.array([[0.0, 1.0, -1.0], [2.0, 0.0, 0.5]]),
        np.array([[0.0, -0.5, 0.3], [0.2, 0.1, -0.3]]),
        np.full((2, 3, 3), 0.4),
    ),
    "Gamma": lambda: gamma_case(np.array([0.5, 2.0, 10.0]), np.array([1.0, 3.0, 0.5])),
    "InverseGamma": lambda: inverse_gamma_case(
        np.array([2.5, 4.0, 10.0]), np.array([1.0, 3.0, 0.5])
    ),
    "Beta": lambda: beta_case(np.array([0.5, 2.0, 10.0]), np.array([3.0, 2.0, 0.7])),
    "Dirichlet": lambda: dirichlet_case(np.array([[0.5, 2.0, 4.0], [5.0, 1.0, 0.3]])),
    "Categorical": lambda: categorical_case(np.array([[0.0, 1.0, -1.0, 2.0]] * 2 + [[3, 0, 0, 0]])),
    "Bernoulli": lambda: bernoulli_case(np.array([-2.0, 0.0, 1.5])),
}


def phi(fam, z):
    if fam.name == "Categorical":
        return fam.sufficient_statistics(z, num_categories=K_CAT)
    return fam.sufficient_statistics(z)


def inner(name, a, b):
    """<a, b> summed over each statistic's own axes; shape batch."""
    return sum(
        jnp.sum(x * y, axis=tuple(range(-n, 0))) if n else x * y
        for x, y, n in zip(a, b, STAT_NDIMS[name])
    )


def close(a, b, rtol=1e-9, atol=1e-9):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def close_tree(a, b, rtol=1e-9, atol=1e-9):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        close(x, y, rtol, atol)


# Everything is computed by two jitted functions per family, compiled once and
# shared by the property tests below: numpyro's side and ours.


def _reference(name):
    def ref(params, z):
        d = MAKE_DIST[name](*params)
        return {"log_prob": d.log_prob(z), "entropy": d.entropy()}

    return jax.jit(ref)


def _ours(fam):
    name = fam.name

    def node_affine(mu, coef):
        nodes, weights = fam.moment_nodes(mu)
        return jnp.sum(weights * (inner(name, phi(fam, nodes), coef) + 1.5), axis=0)

    def round_trip(mu):
        return fam.natural_to_mean(fam.mean_to_natural(mu))

    def ours(lam, mu, z, coef):
        nodes, weights = fam.moment_nodes(mu)
        stats = phi(fam, nodes)
        node_mean = tuple(
            jnp.sum(weights.reshape(weights.shape + (1,) * (s.ndim - weights.ndim)) * s, axis=0)
            for s in stats
        )
        logp = inner(name, phi(fam, z), lam) - fam.log_partition(lam) + fam.log_base_measure(z)
        return {
            "log_prob": logp,
            "to_numpyro_log_prob": fam.to_numpyro(lam).log_prob(z),
            "grad_A": jax.grad(lambda lam: jnp.sum(fam.log_partition(lam)))(lam),
            "mean": fam.natural_to_mean(lam),
            "natural": fam.mean_to_natural(mu),
            "entropy": fam.entropy(lam),
            "nodes": nodes,
            "weights": weights,
            "node_mean": node_mean,
            "node_affine": node_affine(mu, coef),
            "node_affine_grad": jax.grad(lambda mu: jnp.sum(node_affine(mu, coef)))(mu),
            "round_trip_jvp": jax.jvp(round_trip, (mu,), (coef,))[1],
            "round_trip_vjp": jax.vjp(round_trip, mu)[1](coef)[0],
        }

    return jax.jit(ours)


REF = {name: _reference(name) for name in FAMILIES}
OURS = {name: _ours(fam) for name, fam in FAMILIES.items()}


def run(case):
    name = case.family.name
    rng = np.random.default_rng(0)
    coef = tuple(rng.normal(size=m.shape) for m in case.mu)
    if name == "MultivariateNormal":  # only the symmetric part of mu2 is meaningful
        coef = (coef[0], 0.5 * (coef[1] + np.swapaxes(coef[1], -1, -2)))
    ref = REF[name](case.params, case.z)
    ours = OURS[name](case.lam, case.mu, case.z, coef)
    return ref, ours, coef


def by_name(fn):
    """Parametrise over families and draw a random case of each."""
    return pytest.mark.parametrize("name", NAMES)(SETTINGS(given(data=st.data())(fn)))


# ---------------------------------------------------------------- 1. densities


@by_name
def test_log_prob_matches_numpyro(name, data):
    case = data.draw(STRATEGIES[name])
    ref, ours, _ = run(case)
    close(ours["log_prob"], ref["log_prob"], rtol=1e-9, atol=1e-8)
    close(ours["to_numpyro_log_prob"], ref["log_prob"], rtol=1e-9, atol=1e-8)


# ---------------------------------------------------------------- 2./3. mean map


@by_name
def test_grad_log_partition_is_mean(name, data):
    case = data.draw(STRATEGIES[name])
    _, ours, _ = run(case)
    close_tree(ours["grad_A"], case.mu)
    close_tree(ours["mean"], case.mu)


@by_name
def test_mean_to_natural_round_trip(name, data):
    case = data.draw(STRATEGIES[name])
    _, ours, _ = run(case)
    lam = ours["natural"]
    if name == "Categorical":
        close(jax.nn.softmax(lam[0], -1), case.mu[0])
    else:
        close_tree(lam, case.lam, rtol=1e-8, atol=1e-8)


@by_name
def test_mean_to_natural_derivatives(name, data):
    """The derivative of natural_to_mean o mean_to_natural is the identity.

    Checks the implicit-function gradients of the iterative inverses (Gamma,
    Beta, Dirichlet) in forward and reverse mode.
    """
    if name == "Categorical":
        return  # non-minimal: softmax(log p) = p / sum(p) is not the identity off the simplex
    case = data.draw(STRATEGIES[name])
    _, ours, coef = run(case)
    close_tree(ours["round_trip_jvp"], coef, rtol=1e-7, atol=1e-7)
    close_tree(ours["round_trip_vjp"], coef, rtol=1e-7, atol=1e-7)


# ---------------------------------------------------------------- 4. entropy


@by_name
def test_entropy_matches_numpyro(name, data):
    case = data.draw(STRATEGIES[name])
    ref, ours, _ = run(case)
    if name == "Beta":
        # numpyro's Beta.entropy goes through its approximate betaln (~1e-6 off);
        # compare tightly with scipy and loosely with numpyro.
        a, b = case.params
        close(ours["entropy"], stats.beta(a, b).entropy(), rtol=1e-9, atol=1e-9)
        close(ours["entropy"], ref["entropy"], rtol=1e-5, atol=1e-5)
    else:
        close(ours["entropy"], ref["entropy"], rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------- 5. moment nodes


@by_name
def test_moment_nodes_match_mean(name, data):
    case = data.draw(STRATEGIES[name])
    _, ours, coef = run(case)
    nodes, weights = ours["nodes"], ours["weights"]
    n_nodes = {"MultivariateNormal": 2 * 3, "Dirichlet": 1, "Categorical": K_CAT}.get(name, 2)
    assert nodes.shape == (n_nodes,) + case.batch + case.event
    assert weights.shape == (n_nodes,) + case.batch
    close(jnp.sum(weights, 0), np.ones(case.batch))
    assert np.all(np.asarray(weights) >= 0)
    # Beta nodes close to 1 carry 1 - z with absolute (not relative) precision.
    tol, gtol = (1e-6, 1e-4) if name == "Beta" else (1e-8, 1e-6)
    if name == "Dirichlet":
        close(jnp.log(nodes[0]), case.mu[0])
    else:
        close_tree(ours["node_mean"], case.mu, rtol=tol, atol=tol)
    # An affine function of phi has the same expectation under the nodes and
    # under q, and its gradient w.r.t. mu (through the nodes) is its coefficient.
    close(ours["node_affine"], inner(name, case.mu, coef) + 1.5, rtol=tol, atol=tol)
    if name == "Categorical":  # non-minimal: the weights' gradient also sees the constant
        coef = (coef[0] + 1.5,)
    close_tree(ours["node_affine_grad"], coef, rtol=gtol, atol=gtol)


# ---------------------------------------------------------------- 6. sampling, numpyro objects
# Eager numpyro/JAX code compiles every primitive separately, which dominates
# the runtime on a small CPU; below everything runs under one jit per test or
# is only traced (``abstractly``).


def abstractly(fn):
    """Run ``fn`` under ``jax.eval_shape`` (traced, never compiled); return its Python result."""
    out = []
    jax.eval_shape(lambda: out.append(fn()))
    return out[0]


@pytest.mark.parametrize("name", NAMES)
def test_sample_shape_mean_and_gradient(name):
    case = FIXED[name]()
    fam = case.family
    n = 4000
    # Gradients through jax.random.gamma are checked on Gamma; Beta and Dirichlet
    # use the same implicit reparameterisation (and cost much more to compile).
    check_grad = name in ("Normal", "MultivariateNormal", "Gamma")

    @jax.jit
    def draw(lam, params):
        def mc_total_mean(lam):
            z = fam.sample(jax.random.PRNGKey(1), lam, (n,))
            return jnp.sum(jnp.mean(z, axis=0)), z

        d = MAKE_DIST[name](*params)
        out = {"one": fam.sample(jax.random.PRNGKey(2), lam)}
        if check_grad:  # reparameterised: gradients flow into lam
            (_, out["z"]), out["grad"] = jax.value_and_grad(mc_total_mean, has_aux=True)(lam)
            # d E[z] / d lam of numpyro's mean, as a function of lam
            out["exact_grad"] = jax.grad(lambda lam: jnp.sum(fam.to_numpyro(lam).mean))(lam)
        else:
            out["z"] = mc_total_mean(lam)[1]
        if name != "Categorical":
            out["mean"], out["var"] = d.mean, d.variance
        return out

    out = draw(case.lam, case.params)
    z = out["z"]
    # values, our draws and our moment nodes share numpyro's dtype (int64 under x64)
    ref_dtype, node_dtype = abstractly(
        lambda: (
            MAKE_DIST[name](*case.params).sample(jax.random.PRNGKey(0)).dtype,
            fam.moment_nodes(case.mu)[0].dtype,
        )
    )
    assert z.dtype == ref_dtype == node_dtype
    assert z.shape == (n,) + case.batch + case.event
    assert out["one"].shape == case.batch + case.event
    if name == "Categorical":
        close(jnp.mean(jax.nn.one_hot(z, K_CAT), axis=0), case.mu[0], atol=0.03)
        return
    err = np.abs(np.asarray(z.mean(0)) - out["mean"])
    np.testing.assert_array_less(err, 6 * np.sqrt(out["var"] / n))
    if check_grad:
        close_tree(out["grad"], out["exact_grad"], rtol=0.05, atol=0.05)


@pytest.mark.parametrize("name", NAMES)
def test_to_numpyro_shapes(name):
    case = FIXED[name]()
    d, ref = abstractly(lambda: (case.family.to_numpyro(case.lam), MAKE_DIST[name](*case.params)))
    assert d.batch_shape == case.batch
    assert d.event_shape == case.event
    assert isinstance(d, type(ref))


BAD = {
    "Normal": lambda lam: (lam[0], -lam[1]),
    "MultivariateNormal": lambda lam: (lam[0], -lam[1]),
    "Gamma": lambda lam: (lam[0] * 0 - 1.5, lam[1]),
    "InverseGamma": lambda lam: (lam[0] * 0 - 0.5, lam[1]),
    "Beta": lambda lam: (lam[0], lam[1] * 0 - 1.0),
    "Dirichlet": lambda lam: (lam[0].at[..., 0].set(-2.0),),
    "Categorical": lambda lam: (lam[0].at[..., 0].set(jnp.nan),),
    "Bernoulli": lambda lam: (lam[0] * jnp.inf,),
}


@pytest.mark.parametrize("name", NAMES)
def test_is_valid(name):
    case = FIXED[name]()
    fam = case.family
    ok, bad = jax.jit(lambda lam: (fam.is_valid(lam), fam.is_valid(BAD[name](lam))))(case.lam)
    assert ok.shape == case.batch and bool(jnp.all(ok))
    assert not bool(jnp.any(bad))


@pytest.mark.parametrize("name", NAMES)
def test_float32(name):
    """float32 in, float32 out, finite, round trip to float32 accuracy."""
    case = FIXED[name]()
    fam = case.family

    @jax.jit
    def run32(lam):
        mu = fam.natural_to_mean(lam)
        out = (*mu, *fam.mean_to_natural(mu), fam.log_partition(lam), fam.entropy(lam))
        out = out + fam.moment_nodes(mu)[1:]  # weights (nodes may be integer)
        if name in ("Normal", "MultivariateNormal"):  # the cheap samplers
            out = out + (fam.sample(jax.random.PRNGKey(0), lam, (3,)),)
        return out, fam.mean_to_natural(mu)

    out, back = run32(tuple(jnp.asarray(x, dtype=jnp.float32) for x in case.lam))
    for x in out:
        assert x.dtype == jnp.float32 and np.all(np.isfinite(x))
    if name == "Categorical":
        close(jax.nn.softmax(back[0], -1), case.mu[0], rtol=1e-5, atol=1e-6)
    else:
        close_tree(back, case.lam, rtol=2e-3, atol=2e-3)


def test_moment_nodes_zero_variance_has_no_nan():
    nodes, weights = jax.jit(Normal.moment_nodes)(
        (jnp.array([1.0, 2.0]), jnp.array([1.0, 4.0 - 1e-16]))
    )
    assert np.all(np.isfinite(nodes)) and np.all(np.isfinite(weights))
    close(nodes, [[1.0, 2.0], [1.0, 2.0]], atol=1e-7)


# ---------------------------------------------------------------- 7. numpyro -> family


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: dist.Normal(0.0, 1.0).expand([3]).to_event(1), "MultivariateNormal"),
        (lambda: dist.Normal(0.0, 1.0).expand([3]), "Normal"),
        (lambda: dist.Normal(0.0, 1.0), "Normal"),
        (lambda: dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2), None),
        (lambda: dist.Normal(jnp.zeros(3), 1.0).mask(False), "Normal"),
        (lambda: dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)), "MultivariateNormal"),
        (
            lambda: dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)).expand([4]).to_event(1),
            "MultivariateNormal",
        ),
        (lambda: dist.Exponential(2.0), "Gamma"),
        (lambda: dist.Gamma(2.0, 1.0).expand([3]).to_event(1), "Gamma"),
        (lambda: dist.Beta(2.0, 3.0), "Beta"),
        (lambda: dist.Dirichlet(jnp.ones(3)), "Dirichlet"),
        (lambda: dist.Categorical(probs=jnp.ones(3) / 3), "Categorical"),
        (lambda: dist.Categorical(logits=jnp.zeros(3)), "Categorical"),
        (lambda: dist.Bernoulli(probs=0.3), "Bernoulli"),
        (lambda: dist.Bernoulli(logits=0.3), "Bernoulli"),
        (lambda: dist.HalfCauchy(1.0), None),
        (lambda: dist.Poisson(1.0), None),
        (lambda: dist.LogNormal(0.0, 1.0), None),
    ],
)
def test_family_for_distribution(make, expected):
    fam = abstractly(lambda: family_for_distribution(make()))
    assert (fam.name if fam is not None else None) == expected


COV = np.array([[2.0, 0.5], [0.5, 1.0]])
LOC = np.array([1.0, -2.0])
PROBS = np.array([0.2, 0.3, 0.5])
PRIORS = {
    "normal": lambda: dist.Normal(1.0, 2.0).expand([3]),
    "normal_event": lambda: dist.Normal(jnp.array([1.0, -1.0, 0.0]), 2.0).to_event(1),
    "normal_event_masked": lambda: dist.Normal(1.0, 2.0).expand([2, 3]).to_event(1).mask(True),
    "mvn": lambda: dist.MultivariateNormal(LOC, COV).expand([4]),
    "exponential": lambda: dist.Exponential(2.0),
    "gamma": lambda: dist.Gamma(3.0, 0.5).expand([2]),
    "beta": lambda: dist.Beta(2.0, 5.0),
    "dirichlet": lambda: dist.Dirichlet(jnp.array([1.0, 2.0, 3.0])),
    "categorical": lambda: dist.Categorical(probs=PROBS).expand([2]),
    "bernoulli_probs": lambda: dist.Bernoulli(probs=0.3),
    "bernoulli_logits": lambda: dist.Bernoulli(logits=-1.2),
}


def test_natural_from_prior():
    lams = jax.jit(lambda: {k: natural_from_prior(make()) for k, make in PRIORS.items()})()
    close_tree(lams["normal"], (np.full(3, 0.25), np.full(3, -0.125)))
    close_tree(lams["normal_event"], (np.array([0.25, -0.25, 0.0]), -0.125 * np.eye(3)))
    lam = lams["normal_event_masked"]
    assert lam[0].shape == (2, 3) and lam[1].shape == (2, 3, 3)
    close(lam[1][1], -0.125 * np.eye(3))
    prec = np.linalg.inv(COV)
    close_tree(
        lams["mvn"],
        (np.broadcast_to(prec @ LOC, (4, 2)), np.broadcast_to(-0.5 * prec, (4, 2, 2))),
    )
    close_tree(lams["exponential"], (0.0, -2.0))
    close_tree(lams["gamma"], ([2.0, 2.0], [-0.5, -0.5]))
    close_tree(lams["beta"], (1.0, 4.0))
    close_tree(lams["dirichlet"], ([0.0, 1.0, 2.0],))
    (logits,) = lams["categorical"]
    assert logits.shape == (2, 3)
    close(jax.nn.softmax(logits, -1), np.broadcast_to(PROBS, (2, 3)))
    close_tree(lams["bernoulli_probs"], (np.log(0.3 / 0.7),))
    close_tree(lams["bernoulli_logits"], (-1.2,))

    with pytest.raises(TypeError, match="HalfCauchy"):
        abstractly(lambda: natural_from_prior(dist.HalfCauchy(1.0)))


@pytest.mark.parametrize("name", NAMES)
def test_from_numpyro_matches_layout(name):
    case = FIXED[name]()
    lam = jax.jit(lambda params: case.family.from_numpyro(MAKE_DIST[name](*params)))(case.params)
    if name == "Categorical":
        close(jax.nn.softmax(lam[0], -1), case.mu[0])
    else:
        close_tree(lam, case.lam)
