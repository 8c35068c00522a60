"""Variances and precisions as users write them, and what ``fit`` does with them.

1. ``sigma2 ~ InverseGamma`` read as ``Normal(mu, jnp.sqrt(sigma2))``: the conjugate
   family of a variance, so sigma2 gets its exact VMP update (an InverseGamma q).
2. A hierarchy written with Gamma precisions. VMP keeps the group precision mean-field
   with the group effects it scales, which the posterior couples; the after-fit coupling
   check finds q too narrow there, and ``fit`` refits with the precision inside the
   effects' joint Gaussian and keeps the refit because its ELBO is higher
   (``result.diagnostics.refit``).

Both are compared with NUTS.

    python examples/hierarchical_precisions.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS

import autocvi


def unknown_mean_and_variance(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma2 = numpyro.sample("sigma2", dist.InverseGamma(2.0, 2.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, jnp.sqrt(sigma2)), obs=y)


def group_precisions(g, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    prec_theta = numpyro.sample("prec_theta", dist.Gamma(1.0, 1.0))
    prec_y = numpyro.sample("prec_y", dist.Gamma(1.0, 1.0))
    with numpyro.plate("groups", 10):
        theta = numpyro.sample("theta", dist.Normal(mu, 1.0 / jnp.sqrt(prec_theta)))
    with numpyro.plate("N", g.shape[0]):
        numpyro.sample("y", dist.Normal(theta[g], 1.0 / jnp.sqrt(prec_y)), obs=y)


def nuts(model, data):
    mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=4000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), **data)
    return mcmc.get_samples()


def compare(result, data, model, sites):
    draws = result.sample(jax.random.PRNGKey(1), 8000)
    reference = nuts(model, data)
    for site in sites:
        q, r = np.asarray(draws[site]), np.asarray(reference[site])
        print(
            f"  {site:10s} q {q.mean():7.3f} +- {q.std():.3f}   NUTS {r.mean():7.3f} +- "
            f"{r.std():.3f}   sd ratio {q.std() / r.std():.2f}"
        )


def main():
    y = np.random.RandomState(17).normal(3.0, 2.0, size=8)
    data = {"y": y}
    print(autocvi.plan(unknown_mean_and_variance, data))
    result = autocvi.fit(unknown_mean_and_variance, data, progress_bar=False)
    q = result.posterior["sigma2"]
    print(
        f"\nq(sigma2) = InverseGamma({float(q.concentration):.3f}, {float(q.rate):.3f})"
        f"  (exact VMP, {result.num_steps} iterations)"
    )
    compare(result, data, unknown_mean_and_variance, ["mu", "sigma2"])

    rs = np.random.RandomState(26)
    g = np.repeat(np.arange(10), 6)
    data = {"g": g, "y": 2.0 + rs.normal(size=10)[g] + rs.normal(0.0, 1.5, size=g.size)}
    mean_field = autocvi.fit(group_precisions, data, check=False, progress_bar=False)
    result = autocvi.fit(group_precisions, data, progress_bar=False)
    print(f"\nGroup precisions: {result.diagnostics.refit}")
    print(f"  the kept plan:\n{result.schedule}")
    print("mean-field VMP (check=False, no refit):")
    compare(mean_field, data, group_precisions, ["prec_theta", "prec_y"])
    print("fit's default (refitted):")
    compare(result, data, group_precisions, ["prec_theta", "prec_y"])


if __name__ == "__main__":
    main()
