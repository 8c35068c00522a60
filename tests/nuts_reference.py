"""The NUTS run behind the slow tests' stored references (run by hand to regenerate them).

2 chains x 4000 draws after 2000 warmup, ``target_accept_prob`` 0.95, seed 0: minutes
per model. Each test module keeps its reference numbers beside the function that derives
them from these draws.
"""

import jax
from numpyro.infer import MCMC, NUTS


def nuts_samples(make_model, print_summary: bool = True) -> dict:  # pragma: no cover
    """``make_model() -> (model, data)``'s NUTS draws, site -> array (chains pooled)."""
    model, data = make_model()
    mcmc = MCMC(
        NUTS(model, target_accept_prob=0.95),
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
