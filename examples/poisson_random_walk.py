"""Counts on a latent Gaussian random walk: a Markov Gaussian block, O(T) per step.

    x ~ GaussianRandomWalk(scale, T)         log-rate, one vector site
    y_t ~ Poisson(exp(offset + x_t))         in a plate over time

autocvi reads from the model's own log densities that the prior's precision
is tridiagonal and that y_t sees only x_t, keeps one site per year, and
solves each CVI step by a bidiagonal Cholesky / selected inversion (Kalman
filtering plus RTS smoothing written on the precision; CVI paper App. E.2).

1. statsmodels' bundled yearly sunspot numbers (1700-2008, T = 309), with the
   random walk's scale chosen by the ELBO over a small grid;
2. a synthetic series of length T = 100,000, fitted in seconds.

    python examples/poisson_random_walk.py
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import autocvi


def random_walk_poisson(T, offset, y=None, scale=0.3):
    x = numpyro.sample("x", dist.GaussianRandomWalk(scale, num_steps=T))
    with numpyro.plate("time", T):
        numpyro.sample("y", dist.Poisson(jnp.exp(offset + x)), obs=y)


def load_data():
    """Yearly sunspot counts (rounded to integers), statsmodels' bundled copy."""
    import statsmodels.api as sm

    counts = np.round(sm.datasets.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy())
    return {"T": counts.size, "offset": float(np.log(counts.mean())), "y": jnp.asarray(counts)}


def main():
    data = load_data()
    print(autocvi.plan(random_walk_poisson, data))
    print("\nSunspots: the walk's scale chosen by the ELBO")
    fits = {}
    for scale in (0.1, 0.2, 0.3, 0.5, 0.8):
        result = autocvi.fit(random_walk_poisson, {**data, "scale": scale}, progress_bar=False)
        fits[scale] = result
        print(f"  scale {scale:4.2f}: ELBO {result.elbo[-1]:10.2f} ({result.num_steps} iterations)")
    best = max(fits, key=lambda s: fits[s].elbo[-1])
    q = fits[best].posterior["x"]
    rate = np.exp(data["offset"] + np.asarray(q.mean))
    print(f"  best scale {best}: posterior mean rate for 1700-1704: {np.round(rate[:5], 1)}")
    print(f"  observed counts for 1700-1704:                     {np.asarray(data['y'][:5])}")

    T = 100_000
    x = jnp.cumsum(0.01 * jax.random.normal(jax.random.PRNGKey(0), (T,)))
    y = jax.random.poisson(jax.random.PRNGKey(1), jnp.exp(2.0 + x)).astype(jnp.float32)
    synthetic = {"T": T, "offset": 2.0, "y": y, "scale": 0.01}
    start = time.perf_counter()
    result = autocvi.fit(random_walk_poisson, synthetic, progress_bar=False)
    seconds = time.perf_counter() - start
    q = result.posterior["x"]
    z = (np.asarray(q.mean) - np.asarray(x)) / np.sqrt(np.asarray(q.variance))
    print(
        f"\nSynthetic T = {T:,}: {result.num_steps} iterations in {seconds:.1f} s "
        f"(whole call, compilation included); solver: {result.schedule.blocks['x'].solver}; "
        f"RMS of (E[x] - x_true) / sd = {np.sqrt(np.mean(z**2)):.3f} (1 = calibrated)"
    )


if __name__ == "__main__":
    main()
