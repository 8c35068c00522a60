"""NumPyro models written the way NumPyro users write them, with their data.

Each function returns ``(model, data)``: ``model`` is an ordinary NumPyro model
function and ``data`` the dict of keyword arguments to call it with
(observations included). Data come only from scikit-learn's / statsmodels'
bundled datasets (no download) or are simulated with a fixed seed inside the
function, so importing this module is cheap and reads no file.

``MODELS`` maps each name to its function. The oracle references for these
models (NUTS summaries, NumPyro SVI ELBO baselines) live in
``tests/zoo/references/<name>.json``; ``tests/zoo/regenerate.py`` rebuilds them.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def _standardise(X):
    X = np.asarray(X, dtype=float)
    return (X - X.mean(0)) / X.std(0)


# --------------------------------------------------------------------------
# GLMs on bundled datasets


def logistic_plate_intercept():
    """Bayesian logistic regression, sklearn breast cancer (30 features).

    Features standardised over all 569 rows; then rows permuted with
    ``RandomState(0)`` and the first N=284 kept.
    """
    from sklearn.datasets import load_breast_cancer

    X_all, y_all = load_breast_cancer(return_X_y=True)
    X_all = _standardise(X_all)
    perm = np.random.RandomState(0).permutation(X_all.shape[0])[:284]
    X, y = X_all[perm], y_all[perm].astype(float)

    def model(X, y=None):
        N, D = X.shape
        with numpyro.plate("features", D):
            w = numpyro.sample("w", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        with numpyro.plate("n", N):
            numpyro.sample("y", dist.Bernoulli(logits=X @ w + b), obs=y)

    return model, {"X": X, "y": y}


def _randhie(n_rows):
    import statsmodels.api as sm

    df = sm.datasets.randhie.load_pandas().data.iloc[:n_rows]
    y = df["mdvis"].to_numpy().astype(float)
    X = _standardise(df.drop(columns="mdvis").to_numpy())  # the 9 covariates
    return X, y


def poisson_glm():
    """Poisson GLM, statsmodels randhie: ``mdvis`` on its 9 covariates (standardised),
    first 10,095 rows (half of the 20,190)."""
    X, y = _randhie(10_095)

    def model(X, y=None):
        N, D = X.shape
        with numpyro.plate("features", D):
            w = numpyro.sample("w", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(0.0, 5.0))
        eta = X @ w + b
        with numpyro.plate("n", N):
            numpyro.sample("y", dist.Poisson(jnp.exp(eta)), obs=y)

    return model, {"X": X, "y": y}


def negbin_randhie():
    """Negative-binomial GLM, statsmodels randhie first 1,000 rows, ``mdvis`` on
    its 9 covariates (standardised over those rows)."""
    X, y = _randhie(1_000)

    def model(X, y=None):
        N, D = X.shape
        with numpyro.plate("features", D):
            w = numpyro.sample("w", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(0.0, 5.0))
        phi = numpyro.sample("phi", dist.Gamma(2.0, 0.1))
        eta = X @ w + b
        with numpyro.plate("n", N):
            numpyro.sample("y", dist.NegativeBinomial2(mean=jnp.exp(eta), concentration=phi), obs=y)

    return model, {"X": X, "y": y}


# --------------------------------------------------------------------------
# Regressions on simulated data


def studentt_intercept_regression():
    """Linear regression, N=5000, 24 collinear predictors (one shared latent
    factor: pairwise correlation 0.9), Student-t intercept prior, half-Cauchy scale."""
    rs = np.random.RandomState(0)
    N, D = 5000, 24
    factor = rs.normal(size=(N, 1))
    X = np.sqrt(0.9) * factor + np.sqrt(0.1) * rs.normal(size=(N, D))
    w_true = rs.normal(0.0, 0.5, size=D)
    y = X @ w_true + 2.0 + rs.normal(0.0, 1.5, size=N)

    def model(X, y=None):
        N, D = X.shape
        b = numpyro.sample("b", dist.StudentT(3.0, 0.0, 10.0))
        with numpyro.plate("features", D):
            w = numpyro.sample("w", dist.Normal(0.0, 1.0))
        sigma = numpyro.sample("sigma", dist.HalfCauchy(2.5))
        with numpyro.plate("n", N):
            numpyro.sample("y", dist.Normal(X @ w + b, sigma), obs=y)

    return model, {"X": X, "y": y}


def studentt_robust():
    """Robust regression with a Student-t(4) likelihood of known scale 0.5."""
    rs = np.random.RandomState(0)
    X = rs.normal(size=(100, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.3 + rs.normal(0.0, 0.5, size=100)

    def model(X, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        with numpyro.plate("n", 100):
            numpyro.sample("y", dist.StudentT(4.0, X @ w + b, 0.5), obs=y)

    return model, {"X": X, "y": y}


def missing_obs_regression():
    """Linear regression with 20 of 100 responses missing, imputed via ``obs_mask``
    (NumPyro creates the latent ``y_unobserved`` and the observed ``y_observed``)."""
    rs = np.random.RandomState(0)
    X = rs.normal(size=(100, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + rs.normal(0.0, 0.5, size=100)
    missing = np.sort(rs.choice(100, size=20, replace=False))
    y[missing] = np.nan
    mask = np.isfinite(y)
    y_filled = np.where(mask, y, 0.0)

    def model(X, y_filled=None, mask=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        with numpyro.plate("n", 100):
            numpyro.sample("y", dist.Normal(X @ w, 0.5), obs=y_filled, obs_mask=mask)

    return model, {"X": X, "y_filled": y_filled, "mask": mask}


# --------------------------------------------------------------------------
# Hierarchical models


def hierarchical_logit():
    """Hierarchical logistic model, 8 groups of 30; y simulated from the model (seed 0)."""

    def model(g, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
        with numpyro.plate("groups", 8):
            a = numpyro.sample("a", dist.Normal(mu, 1.0))
        with numpyro.plate("n", g.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=a[g]), obs=y)

    # Simulated with numpy, not by running the model under a numpyro seed: JAX's
    # random bits differ between float32 and float64, so the data would too.
    g = np.repeat(np.arange(8), 30)
    rs = np.random.RandomState(0)
    mu = rs.normal(0.0, 2.0)
    a = rs.normal(mu, 1.0, size=8)
    y = (rs.uniform(size=g.size) < 1.0 / (1.0 + np.exp(-a[g]))).astype(float)
    return model, {"g": g, "y": y}


def eight_schools():
    """Eight schools, non-centred parameterisation."""
    y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])

    def model(sigma, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("J", 8):
            theta_raw = numpyro.sample("theta_raw", dist.Normal(0.0, 1.0))
            theta = numpyro.deterministic("theta", mu + tau * theta_raw)
            numpyro.sample("y", dist.Normal(theta, sigma), obs=y)

    return model, {"sigma": sigma, "y": y}


# --------------------------------------------------------------------------
# Time series and GP


def local_level():
    """Local-level (random walk plus noise) model, T=100 simulated (seed 0):
    level sd 0.5 per step, observation sd 0.5, offset 2."""
    rs = np.random.RandomState(0)
    T = 100
    level = np.cumsum(rs.normal(0.0, 0.5, size=T))
    y = 2.0 + level + rs.normal(0.0, 0.5, size=T)

    def model(T, y=None):
        tau_level = numpyro.sample("tau_level", dist.Gamma(2.0, 1.0))
        tau_obs = numpyro.sample("tau_obs", dist.Gamma(2.0, 1.0))
        offset = numpyro.sample("offset", dist.Normal(0.0, 10.0))
        level = numpyro.sample(
            "level", dist.GaussianRandomWalk(scale=1.0 / jnp.sqrt(tau_level), num_steps=T)
        )
        numpyro.sample("y", dist.Normal(offset + level, 1.0 / jnp.sqrt(tau_obs)), obs=y)

    return model, {"T": T, "y": y}


def poisson_random_walk():
    """Poisson counts around a Gaussian random walk with a latent Gamma precision and an
    offset (issue 12: crashed in the first Gauss-Hermite message). T = 100, simulated."""
    rs = np.random.RandomState(0)
    T = 100
    walk = np.cumsum(rs.normal(0.0, 0.2, T))
    y = rs.poisson(np.exp(1.0 + walk)).astype(float)

    def model(T, y=None):
        tau = numpyro.sample("tau", dist.Gamma(2.0, 0.1))
        offset = numpyro.sample("offset", dist.Normal(0.0, 3.0))
        f = numpyro.sample("f", dist.GaussianRandomWalk(1.0 / jnp.sqrt(tau), num_steps=T))
        with numpyro.plate("t", T):
            numpyro.sample("y", dist.Poisson(jnp.exp(offset + f)), obs=y)

    return model, {"T": T, "y": y}


def gp_latent_lengthscale():
    """Latent GP with a log-normal length-scale, n=20 points on [0, 3], y = sin(2x)."""
    x = np.linspace(0.0, 3.0, 20)
    y = np.sin(2.0 * x)

    def model(x, y=None):
        n = x.shape[0]
        ls = numpyro.sample("ls", dist.LogNormal(0.0, 1.0))
        K = jnp.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / ls**2) + 1e-4 * jnp.eye(n)
        f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(n), covariance_matrix=K))
        with numpyro.plate("n", n):
            numpyro.sample("y", dist.Normal(f, 0.2), obs=y)

    return model, {"x": x, "y": y}


# --------------------------------------------------------------------------
# Mixture


def _iris_petals():
    from sklearn.datasets import load_iris

    return _standardise(load_iris().data[:, 2:4])  # petal length, petal width


def iris_mixture():
    """3-component Gaussian mixture on standardised iris petal length/width, with
    explicit discrete assignments z, and an isotropic precision per component."""
    y = _iris_petals()

    def model(y):
        N, D = y.shape
        K = 3
        weights = numpyro.sample("weights", dist.Dirichlet(jnp.ones(K)))
        with numpyro.plate("K", K):
            locs = numpyro.sample("locs", dist.Normal(0.0, 3.0).expand([D]).to_event(1))
            prec = numpyro.sample("prec", dist.Gamma(2.0, 1.0))
        with numpyro.plate("n", N):
            z = numpyro.sample("z", dist.Categorical(weights))
            scale = (1.0 / jnp.sqrt(prec[z]))[:, None]
            numpyro.sample("y", dist.Normal(locs[z], scale).to_event(1), obs=y)

    return model, {"y": y}


def iris_mixture_marginal():
    """``iris_mixture`` with z summed out (MixtureSameFamily): for NUTS."""
    y = _iris_petals()

    def model(y):
        N, D = y.shape
        K = 3
        weights = numpyro.sample("weights", dist.Dirichlet(jnp.ones(K)))
        with numpyro.plate("K", K):
            locs = numpyro.sample("locs", dist.Normal(0.0, 3.0).expand([D]).to_event(1))
            prec = numpyro.sample("prec", dist.Gamma(2.0, 1.0))
        components = dist.Normal(locs, (1.0 / jnp.sqrt(prec))[:, None]).to_event(1)
        mixture = dist.MixtureSameFamily(dist.Categorical(probs=weights), components)
        with numpyro.plate("n", N):
            numpyro.sample("y", mixture, obs=y)

    return model, {"y": y}


MODELS = {
    "logistic_plate_intercept": logistic_plate_intercept,
    "poisson_glm": poisson_glm,
    "studentt_intercept_regression": studentt_intercept_regression,
    "hierarchical_logit": hierarchical_logit,
    "studentt_robust": studentt_robust,
    "negbin_randhie": negbin_randhie,
    "missing_obs_regression": missing_obs_regression,
    "eight_schools": eight_schools,
    "local_level": local_level,
    "poisson_random_walk": poisson_random_walk,
    "gp_latent_lengthscale": gp_latent_lengthscale,
    "iris_mixture": iris_mixture,
    "iris_mixture_marginal": iris_mixture_marginal,
}
