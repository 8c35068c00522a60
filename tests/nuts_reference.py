"""The NUTS run behind the slow tests' stored references (run by hand to regenerate them).

2 chains x 4000 draws after 2000 warmup, ``target_accept_prob`` 0.95, seed 0: minutes
per model. Each test module keeps its reference numbers beside the function that derives
them from these draws.
"""

import jax
from numpyro.infer import MCMC, NUTS


def nuts_samples(
    make_model, print_summary: bool = True, **nuts_options
) -> dict:  # pragma: no cover
    """``make_model() -> (model, data)``'s NUTS draws, site -> array (chains pooled);
    ``nuts_options`` go to ``NUTS`` (``dense_mass=True`` where the posterior couples
    coordinates tightly: a diagonal mass matrix left an intercept and its group effects
    at an effective sample size of 45 in 8,000 draws)."""
    model, data = make_model()
    mcmc = MCMC(
        NUTS(model, **{"target_accept_prob": 0.95, **nuts_options}),
        num_warmup=2000,
        num_samples=4000,
        num_chains=2,
        chain_method="sequential",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), **data)
    if print_summary:
        mcmc.print_summary(exclude_deterministic=True)
    return mcmc.get_samples()
