"""Which latents the planner puts in one joint Gaussian (``analysis/joint.py``): the
rule for global hyperparameters, with its soundness (the groups it forms are the ones
the posterior couples) and its completeness (the models it must leave alone keep
their exact conjugate updates and their families)."""

import sys
from pathlib import Path

import numpy as np
import numpyro
import numpyro.distributions as dist

import autocvi

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import models as zoo_models  # noqa: E402


def groups_and_nodes(model, data):
    schedule = autocvi.plan(model, data)
    groups = [set(g.member_names) for g in schedule.joint]
    families = {name: node.layout.q_family for name, node in schedule.nodes.items()}
    return groups, families


def test_gamma_hyperparameters_sharing_a_non_conjugate_factor_share_one_gaussian():
    """``lam ~ Gamma(alpha, beta)``: not conjugate to alpha, conjugate to beta. NUTS
    correlates them at 0.95 (tests/zoo/references/gamma_poisson_hierarchy.json), so
    they share one Gaussian on (log alpha, log beta); lam keeps its exact Gamma
    updates (conjugate to both its factors)."""
    model, data = zoo_models.gamma_poisson_hierarchy()
    groups, families = groups_and_nodes(model, data)
    assert groups == [{"alpha", "beta"}]
    assert families["lam"] == "Gamma"


def test_plated_gamma_factors_keep_their_families():
    """Poisson factorisation: U and V are plated Gamma factors coupled by a
    non-conjugate Poisson likelihood; the papers keep them Gamma (no joint group)."""
    model, data = zoo_models.poisson_factorisation()
    groups, families = groups_and_nodes(model, data)
    assert groups == []
    assert {families[n] for n in families} == {"Gamma"}


def normal_gamma(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.Gamma(2.0, 2.0))
    with numpyro.plate("n", 20):
        numpyro.sample("y", dist.Normal(mu, tau**-0.5), obs=y)


def test_a_conjugate_hyperparameter_with_only_conjugate_factors_keeps_vmp():
    """Normal-Gamma: every factor is conjugate to mu and tau (textbook VMP), so the
    rule must not fire however small and global they are."""
    y = np.random.RandomState(0).randn(20) + 1.0
    groups, families = groups_and_nodes(normal_gamma, {"y": y})
    assert groups == []
    assert families == {"mu": "Normal", "tau": "Gamma"}


def plated_rate_with_global_scale(y=None):
    # a non-conjugate plated latent (phi) with a global conjugate hyperparameter (b):
    # no Gaussian member and a plated one, so the Gamma nodes stay (as in the papers)
    b = numpyro.sample("b", dist.Gamma(2.0, 1.0))
    with numpyro.plate("groups", 5):
        phi = numpyro.sample("phi", dist.Gamma(2.0, b))
        numpyro.sample("y", dist.Poisson(phi + 1.0), obs=y)


def test_a_plated_non_conjugate_latent_does_not_pull_in_a_global():
    groups, families = groups_and_nodes(plated_rate_with_global_scale, {"y": np.arange(5.0)})
    assert groups == []
    assert families["b"] == "Gamma"
