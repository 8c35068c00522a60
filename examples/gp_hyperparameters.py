"""GP regression with learned kernel hyperparameters (variational EM, t-SVGP Eq. 15).

The motorcycle data (times after impact against head acceleration), a GP with a
squared-exponential kernel whose length-scale, amplitude and noise are
``numpyro.param`` sites. ``autocvi.fit`` learns them by variational EM: CVI
E-steps, and M-steps on the ELBO with q's sites held and the prior moving with
the params (Adam, Chang, Khan & Solin, *Dual Parameterization of Sparse
Variational Gaussian Processes*, Eq. 15), which for a Gaussian likelihood is the
log marginal likelihood itself. The learned values are compared with
scikit-learn's exact type-II maximum likelihood (when scikit-learn is installed).

    python examples/gp_hyperparameters.py
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

import autocvi

JITTER = 1e-4


def gp_regression(X, y=None):
    lengthscale = numpyro.param("lengthscale", 1.0, constraint=constraints.positive)
    amplitude = numpyro.param("amplitude", 1.0, constraint=constraints.positive)
    noise = numpyro.param("noise", 0.5, constraint=constraints.positive)
    d = X[:, None] - X[None, :]
    K = amplitude**2 * jnp.exp(-0.5 * (d / lengthscale) ** 2) + JITTER * jnp.eye(X.shape[0])
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(X.shape[0]), covariance_matrix=K))
    numpyro.sample("y", dist.Normal(f, noise), obs=y)


def main():
    jax.config.update("jax_enable_x64", True)
    data = autocvi.datasets.load("mcycle")["data"]
    x = (data[:, 0] - data[:, 0].mean()) / data[:, 0].std()
    y = (data[:, 1] - data[:, 1].mean()) / data[:, 1].std()
    print(autocvi.plan(gp_regression, dict(X=x, y=y)))
    start = time.perf_counter()
    result = autocvi.fit(gp_regression, dict(X=x, y=y), progress_bar=False)
    seconds = time.perf_counter() - start
    print(
        f"\nvariational EM: {result.em.rounds} rounds, {result.num_steps} CVI iterations, "
        f"{seconds:.1f} s, converged={result.converged}; final ELBO {result.elbo[-1]:.6f}"
    )
    try:
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
    except ImportError:
        reference = None
    else:
        kernel = ConstantKernel(1.0) * RBF(1.0) + WhiteKernel(0.25)
        gpr = GaussianProcessRegressor(kernel, alpha=JITTER).fit(x[:, None], y)
        k = gpr.kernel_
        reference = {
            "lengthscale": k.k1.k2.length_scale,
            "amplitude": np.sqrt(k.k1.k1.constant_value),
            "noise": np.sqrt(k.k2.noise_level),
        }
        print(f"scikit-learn log marginal likelihood {gpr.log_marginal_likelihood_value_:.6f}")
    print(f"\n{'param':12s} {'autocvi':>10s} {'sklearn':>10s}")
    for name, value in result.params.items():
        ref = "" if reference is None else f"{reference[name]:10.5f}"
        print(f"{name:12s} {float(value):10.5f} {ref}")


if __name__ == "__main__":
    main()
