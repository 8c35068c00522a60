"""Every registry entry is complete, and the code that consumes a registry covers all of it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import pytest

import autocvi
from autocvi import families
from autocvi.engine import cvi
from autocvi.families.base import OPTIONAL_FIELDS
from autocvi.model import message_kinds
from autocvi.model.graph import MESSAGE_COLOURS


@pytest.mark.parametrize("kind", list(message_kinds.MESSAGE_KINDS.values()), ids=str)
def test_message_kind_entries_are_complete(kind):
    for f in dataclasses.fields(kind):
        value = getattr(kind, f.name)
        assert value is not None and value != "", f.name
    assert 0.0 < kind.default_step <= 1.0
    assert isinstance(kind.deterministic, bool)
    assert MESSAGE_COLOURS[kind.name] == kind.colour


def normal_mean(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("n", 3):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def test_the_engine_computes_every_registered_kind():
    cvi(autocvi.plan(normal_mean, {"y": jnp.ones(3)}))  # raises if one is missing


def test_an_unimplemented_kind_is_refused(monkeypatch):
    """Completeness of the check above: a registry entry without an engine function fails."""
    extra = message_kinds.MessageKind("new-kind", "never", False, 0.5, "black")
    monkeypatch.setitem(message_kinds.MESSAGE_KINDS, "new-kind", extra)
    with pytest.raises(NotImplementedError, match="new-kind"):
        cvi(autocvi.plan(normal_mean, {"y": jnp.ones(3)}))


@pytest.mark.parametrize("family", list(families.FAMILIES.values()), ids=lambda f: f.name)
def test_family_entries_are_complete(family):
    for name in family._fields[2:]:
        value = getattr(family, name)
        if name in OPTIONAL_FIELDS:
            assert value is None or callable(value), name
        else:
            assert callable(value), name


def test_gaussian_families_keep_an_indefinite_step_in_the_domain():
    """The Gaussians declare a domain-preserving step; it fixes what the plain step breaks."""
    for name in ("Normal", "MultivariateNormal"):
        assert families.FAMILIES[name].domain_preserving_step is not None, name
    fam = families.FAMILIES["MultivariateNormal"]
    lam = (jnp.zeros(2), -0.5 * jnp.eye(2))
    target = (jnp.array([1.0, 0.0]), -0.5 * jnp.array([[5.0, 0.0], [0.0, -3.0]]))  # indefinite
    plain = jax.tree_util.tree_map(lambda o, t: 0.5 * o + 0.5 * t, lam, target)
    assert not bool(fam.is_valid(plain))
    assert bool(fam.is_valid(fam.domain_preserving_step(lam, target, 0.5)))


@pytest.mark.parametrize(
    "prior, family",
    [
        (dist.Gamma(2.0, 1.0), "Gamma"),
        (dist.Chi2(3.0), "Gamma"),  # a subclass: matched by isinstance
        (dist.Exponential(2.0), "Gamma"),
        (dist.InverseGamma(2.0, 1.0), "InverseGamma"),  # a TransformedDistribution
        (dist.Beta(2.0, 2.0), "Beta"),
        (dist.BetaProportion(0.3, 5.0), "Beta"),
        (dist.Uniform(0.0, 1.0), "Beta"),  # Beta(1, 1)
        (dist.Uniform(0.0, jnp.ones(3)).to_event(1), "Beta"),  # as Beta(...).to_event(1)
        (dist.Uniform(0.0, 2.0), None),  # other bounds: not a Beta
        (dist.Uniform(-1.0, 1.0), None),
        (dist.Dirichlet(jnp.ones(3)), "Dirichlet"),
        (dist.Categorical(probs=jnp.ones(3) / 3), "Categorical"),
        (dist.Bernoulli(probs=0.3), "Bernoulli"),
        (dist.Normal(0.0, 1.0), "Normal"),
        (dist.Normal(0.0, 1.0).expand([3]).to_event(1), "MultivariateNormal"),
        (dist.HalfCauchy(1.0), None),
        (dist.LogNormal(0.0, 1.0), None),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str | type(None)) else str(v),
)
def test_family_registry_matches_by_isinstance(prior, family):
    found = families.family_for_distribution(prior)
    assert (found.name if found is not None else None) == family


def test_block_solvers_implement_the_protocol():
    from autocvi.blocks.block_solvers import BLOCK_SOLVERS, BlockSolver

    methods = [n for n in vars(BlockSolver) if not n.startswith("_") and n != "name"]
    assert set(methods) == {
        "solve",
        "moments",
        "precision",
        "sample",
        "predictive_variance",
        "log_det_covariance",
        "log_density",
    }
    for key, solver in BLOCK_SOLVERS.items():
        assert solver.name == key
        for method in methods:
            assert callable(getattr(solver, method)), (key, method)


@pytest.mark.parametrize(
    "d",
    [
        dist.Normal(0.0, 1.0),
        dist.Normal(jnp.zeros(3), 1.0).to_event(1),
        dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)),
        dist.Gamma(2.0, 1.0),
        dist.Exponential(1.0),
        dist.Chi2(3.0),
        dist.InverseGamma(2.0, 1.0),
        dist.Beta(1.0, 2.0),
        dist.Uniform(0.0, 1.0),
        dist.Dirichlet(jnp.ones(3)),
        dist.Categorical(logits=jnp.zeros(3)),
        dist.OrderedLogistic(0.0, jnp.array([-1.0, 1.0])),
        dist.Bernoulli(logits=0.0),
        dist.HalfCauchy(1.0),
        dist.Normal(jnp.zeros((2, 2)), 1.0).to_event(2),
    ],
    ids=lambda d: type(d).__name__,
)
def test_at_most_one_family_matches(d):
    """Families declare their matches; the declarations never overlap."""
    assert sum(f.matches(d) for f in families.FAMILIES.values()) <= 1


# One prior per family, batched over 2 x 3 draws: its natural parameter fixes the layout.
_BATCHED_PRIOR = {
    "Normal": dist.Normal(0.0, 1.0).expand([2, 3]),
    "MultivariateNormal": dist.MultivariateNormal(jnp.zeros(3), jnp.eye(3)).expand([2]),
    "Gamma": dist.Gamma(2.0, 1.0).expand([2, 3]),
    "InverseGamma": dist.InverseGamma(2.0, 1.0).expand([2, 3]),
    "Beta": dist.Beta(2.0, 2.0).expand([2, 3]),
    "Dirichlet": dist.Dirichlet(jnp.ones(3)).expand([2]),
    "Categorical": dist.Categorical(logits=jnp.zeros(4)).expand([2, 3]),
    "Bernoulli": dist.Bernoulli(logits=0.0).expand([2, 3]),
}


@pytest.mark.parametrize("name", list(families.FAMILIES))
def test_reference_natural_is_valid_in_the_prior_layout(name):
    """The planner's probes read q from ``Family.reference_natural``: it must lie in the natural
    domain with exactly the layout ``natural_from_prior`` gives (a family added without an
    entry here fails the KeyError, one with a wrong layout the shape check)."""
    fam, prior = families.FAMILIES[name], _BATCHED_PRIOR[name]
    expected = families.natural_from_prior(prior)
    shape = (2, 3)  # a draw of the family's layout (Categorical: K separately)
    lam = fam.reference_natural(jax.random.PRNGKey(0), shape, num_categories=4)
    assert [jnp.shape(x) for x in lam] == [jnp.shape(x) for x in expected]
    assert bool(jnp.all(fam.is_valid(lam)))
    assert jnp.all(jnp.isfinite(jax.tree.leaves(fam.natural_to_mean(lam))[0]))
