"""Gaussian mixture on iris (K = 3): autocvi (VMP) vs BayesPy (VMP) vs NumPyro SVI
(TraceEnum_ELBO), each q(pi, mu, tau) scored by its collapsed ELBO (z summed out) and its
mean-field ELBO with the optimal q(z): ``python -m benchmarks gaussian_mixture [--quick]``."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer.autoguide import AutoNormal
from numpyro.infer.util import log_density
from numpyro.optim import Adam

import autocvi

from . import driver as D

NAME = "gaussian_mixture"
SETTINGS = {
    "data": "iris (sklearn), 150 x 4, standardised (zero mean, unit variance per column)",
    "K": 3,
    "prior": "pi ~ Dir(1), mu_k ~ N(0, I_4), tau_kd ~ Gamma(2, 1) (rate 1)",
    "autocvi_num_steps": 100,
    "autocvi_seeds": [0, 1, 2],
    "convergence_rule": "relative ELBO change < 1e-6 between iterations (autocvi.fit's rule)",
    "bayespy_num_steps": 100,
    "bayespy_seeds": [0, 1, 2],
    "bayespy_update_order": "alpha(pi), mu, tau, z (z initialised from random)",
    "svi_guide": "AutoNormal(block(model, hide=['z'])) (default init_to_uniform, init_scale=0.1)",
    "svi_loss": "TraceEnum_ELBO(max_plate_nesting=1), z enumerated in parallel",
    "svi_learning_rates": [1e-3, 1e-2, 5e-2],
    "svi_num_steps": 10000,
    "svi_grid_points": 60,
    "estimator_num_samples": 8192,
    "estimator_rng_key": 12345,
    "thresholds_nats": [1.0, 0.1],
}
QUICK = {"autocvi_num_steps": 60, "autocvi_seeds": [0, 1], "bayespy_num_steps": 60}
QUICK.update(
    bayespy_seeds=[0, 1], svi_num_steps=2000, svi_grid_points=30, estimator_num_samples=4096
)


def gmm(X, K=3, marginal=False):
    """The mixture; ``marginal``: z summed out (MixtureSameFamily), for the collapsed ELBO."""
    N, D_ = X.shape
    pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(K)))
    with numpyro.plate("components", K):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0).expand([D_]).to_event(1))
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0).expand([D_]).to_event(1))
    with numpyro.plate("data", N):
        if marginal:
            comp = dist.Normal(mu, 1.0 / jnp.sqrt(tau)).to_event(1)
            numpyro.sample("x", dist.MixtureSameFamily(dist.Categorical(pi), comp), obs=X)
        else:
            z = numpyro.sample("z", dist.Categorical(pi))
            numpyro.sample("x", dist.Normal(mu[z], 1.0 / jnp.sqrt(tau[z])).to_event(1), obs=X)


class MixtureEstimator(D.ELBOEstimator):
    """Collapsed and mean-field ELBOs of q(pi, mu, tau) from one set of draws (shared key)."""

    def __init__(self, data, num_samples, rng_key):
        X, data = data["X"], {**data, "marginal": True}
        super().__init__(gmm, data, num_samples, rng_key)  # the collapsed ELBO
        prior = handlers.block(gmm, hide=["x"])  # log p(pi, mu, tau)
        self._prior = jax.jit(jax.vmap(lambda z: log_density(prior, (), data, z)[0]))

        def terms(z):  # the E-step's log pi_k + log N(x_n | mu_k, tau_k)
            comp = dist.Normal(z["mu"], 1.0 / jnp.sqrt(z["tau"])).log_prob(X[:, None, :]).sum(-1)
            return jnp.log(z["pi"]) + comp

        self._terms = jax.jit(jax.vmap(terms))

    def __call__(self, q) -> dict:
        q = {k: v for k, v in q.items() if k != "z"}
        collapsed, se = super().__call__(q)
        pq, lsum = [], 0.0
        for z, log_q in self.draws(q):
            pq.append(np.asarray(self._prior(z), np.float64) - np.asarray(log_q, np.float64))
            lsum = lsum + np.asarray(self._terms(z), np.float64).sum(0)
        pq = np.concatenate(pq)
        if not (np.isfinite(collapsed) and np.all(np.isfinite(pq))):
            return dict.fromkeys(("collapsed", "collapsed_se", "meanfield"), float("nan"))
        # the optimal q(z): sum_n log sum_k exp E_q[log pi_k + log N(x_n | mu_k, tau_k)]
        lse = np.sum(np.logaddexp.reduce(lsum / self.num_samples, axis=1))
        return {"collapsed": collapsed, "collapsed_se": se, "meanfield": lse + pq.mean()}


def build_bayespy(data, seed):
    """The same model in BayesPy (cluster plate last); q as numpyro Distributions."""
    from bayespy.inference import VB
    from bayespy.nodes import Categorical, Dirichlet, Gamma, GaussianARD, Mixture

    X, K = np.asarray(data["X"], np.float64), data["K"]
    N, Dd = X.shape
    alpha = Dirichlet(np.ones(K), name="pi")
    z = Categorical(alpha, plates=(N, 1), name="z")
    mu = GaussianARD(0.0, 1.0, shape=(), plates=(Dd, K), name="mu")
    tau = Gamma(2.0, 1.0, plates=(Dd, K), name="tau")
    Y = Mixture(z, GaussianARD, mu, tau, name="x")
    Y.observe(X)
    np.random.seed(seed)
    z.initialize_from_random()

    def snapshot():
        f32 = lambda a: jnp.asarray(np.broadcast_to(a, (Dd, K)).T, jnp.float32)  # noqa: E731
        var = -0.5 / np.array(mu.phi[1], float)
        return {
            "pi": dist.Dirichlet(jnp.asarray(alpha.phi[0], jnp.float32)),
            "mu": dist.Normal(f32(np.array(mu.phi[0]) * var), f32(np.sqrt(var))),
            "tau": dist.Gamma(f32(np.array(tau.phi[1], float)), f32(-np.array(tau.phi[0], float))),
        }

    return VB(Y, alpha, mu, tau, z), snapshot


def autonormal_q(p):
    """q of AutoNormal(block(gmm, hide=["z"])): Normal in each site's unconstrained space."""
    pi = dist.Normal(p["pi_auto_loc"], p["pi_auto_scale"]).to_event(1)
    return {
        "pi": dist.TransformedDistribution(pi, dist.transforms.StickBreakingTransform()),
        "mu": dist.Normal(p["mu_auto_loc"], p["mu_auto_scale"]),
        "tau": dist.LogNormal(p["tau_auto_loc"], p["tau_auto_scale"]),
    }


def converged_at(trace, rtol=1e-6):
    """The first iteration whose objective changed by at most ``rtol`` (relative)."""
    t = np.asarray(trace, float)
    hit = np.flatnonzero(np.abs(np.diff(t)) <= rtol * np.maximum(1.0, np.abs(t[1:])))
    return int(hit[0]) + 2 if hit.size else None


def run(quick=False):
    from numpyro.contrib.funsor import config_enumerate
    from numpyro.infer import TraceEnum_ELBO
    from sklearn.datasets import load_iris

    st, X = {**SETTINGS, **(QUICK if quick else {})}, load_iris().data
    data = {"X": jnp.asarray((X - X.mean(0)) / X.std(0), jnp.float32), "K": st["K"]}
    est = MixtureEstimator(data, st["estimator_num_samples"], st["estimator_rng_key"])
    # Does rng_key change autocvi's initialisation? If not, other seeds are the same run.
    cvi = autocvi.CVI(gmm)
    s0, s1 = (jax.tree.leaves(cvi.init(k, **data).state.natural) for k in (0, 1))
    init_diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(s0, s1))
    seeds = st["autocvi_seeds"] if init_diff > 1e-4 else st["autocvi_seeds"][:1]
    n, nb, ns = st["autocvi_num_steps"], st["bayespy_num_steps"], st["svi_num_steps"]
    grid, entries = sorted(set(range(31)) | set(D.log_grid(n, 40))), []
    for s in seeds:
        entries.append(D.Entry(D.AutocviMethod(f"autocvi-seed{s}", rng_key=s), gmm, data, n, grid))
    try:
        import bayespy  # noqa: F401

        bp_error = None
    except Exception as e:  # noqa: BLE001 - run without it, saying why
        bp_error = f"{type(e).__name__}: {e}"
    grid = sorted(set(range(1, 31)) | set(D.log_grid(nb, 40)))
    for s in [] if bp_error else st["bayespy_seeds"]:
        m = D.BayesPyMethod(f"bayespy-seed{s}", build_bayespy, s, "BayesPy VB")
        entries.append(D.Entry(m, None, data, nb, grid))
    guide = lambda mod: AutoNormal(handlers.block(mod, hide=["z"]))  # noqa: E731
    loss, grid = TraceEnum_ELBO(max_plate_nesting=1), D.log_grid(ns, st["svi_grid_points"])
    for lr in st["svi_learning_rates"]:
        label, setting = f"svi-adam-{lr:g}", f"AutoNormal, Adam lr={lr:g}, TraceEnum_ELBO"
        m = D.SVIMethod(label, guide, Adam(lr), loss, 0, setting, posterior_fn=autonormal_q)
        entries.append(D.Entry(m, config_enumerate(gmm), data, ns, grid))
    thresholds = st["thresholds_nats"]
    methods, ref = D.experiment(entries, est, key="collapsed", thresholds=thresholds, refine=())
    fit = D.timed_fit(gmm, data, rng_key=st["autocvi_seeds"][0])
    fit.update(est(fit["_result"].posterior))
    for m in methods.values():
        own = {str(t): m["final"]["collapsed"] - t for t in thresholds}
        m["hits_own"] = {t: D.first_hit(m["iters"], m["collapsed"], v) for t, v in own.items()}
        if m["kind"] != "svi":
            m["converged_at"] = it = converged_at(m["objective"])
            m["converged_time"] = None if it is None else it * m["per_iter_time"]
    out = {"bayespy_error": bp_error, "autocvi_init_max_abs_difference_key0_vs_key1": init_diff}
    out["reference_meanfield_elbo"] = np.nanmax([m["final"]["meanfield"] for m in methods.values()])
    out.update(reference_collapsed_elbo=ref, autocvi_fit_defaults=fit, methods=methods)
    out["autocvi_schedule"] = str(entries[0].method.schedule)
    return D.publish(NAME, st, markdown, panels, "Gaussian mixture, iris (N=150, D=4, K=3)", **out)


def _pm(final):
    return f"{final['collapsed']:.3f} ± {final['collapsed_se']:.3f}"


COLUMNS = [
    ("run", lambda k, m: k, None),
    ("converged at (rel. change < 1e-6)", "converged_at", "d"),
    ("loop s to converge", "converged_time", ".3g"),
    ("iters to own final −1 nat", D.at("hits_own", "1.0"), "d"),
    ("iters to own final −0.1 nat", D.at("hits_own", "0.1"), "d"),
    *D.hit_columns(SETTINGS["thresholds_nats"]),  # to ELBO*c - 1 and - 0.1 nat
    ("final mean-field ELBO", D.at("final", "meanfield"), ".3f"),
    ("final collapsed ELBO (± se)", lambda k, m: _pm(m["final"]), None),
    ("final native objective", lambda k, m: float(m["objective"][-1]), ".3f"),
    *D.TIMING_COLUMNS,
]


def headline(p):
    """The best run of each kind (autocvi and BayesPy by the mean-field ELBO, SVI by the
    collapsed one) in the columns of the full table, and how they compare."""
    runs, best = p["methods"], {}
    for kind, key in (("autocvi", "meanfield"), ("bayespy", "meanfield"), ("svi", "collapsed")):
        ok = [k for k, m in runs.items() if m["kind"] == kind and np.isfinite(m["final"][key])]
        if ok:
            best[kind] = max(ok, key=lambda k, key=key: runs[k]["final"][key])
    a, fi = runs[best["autocvi"]], p["autocvi_fit_defaults"]
    lines = [f"BayesPy: not run ({p['bayespy_error']})."]
    if "bayespy" in best:
        b = runs[best["bayespy"]]
        ratio = b["per_iter_time"] / a["per_iter_time"]
        diff = a["final"]["meanfield"] - b["final"]["meanfield"]
        lines[0] = f"Per-iteration time BayesPy / autocvi: {ratio:.2f}x; mean-field ELBO, "
        lines[0] += f"autocvi − BayesPy: {diff:+.4f} nats."
    lines.append(D.fit_line(fi, f"mean-field ELBO (common estimator) {fi['meanfield']:.3f}"))
    if p["autocvi_init_max_abs_difference_key0_vs_key1"] <= 1e-4:
        lines.append("autocvi's initialisation does not depend on `rng_key`: one autocvi run.")
    table = D.table(COLUMNS, {k: runs[k] for k in best.values()})
    return table + "\n\n" + "\n".join(f"- {line}" for line in lines)


def markdown(p):
    st = p["settings"]
    ran = "BayesPy ran (same mean-field family and objective as autocvi)."
    if p["bayespy_error"] is not None:
        ran = f"**BayesPy could not be used**: {p['bayespy_error']}"
    return f"""# Gaussian mixture (iris, K=3): autocvi VMP vs NumPyro SVI (TraceEnum_ELBO) vs \
BayesPy

{D.env_line(p["environment"], NAME)}

Data: {st["data"]}. Prior: {st["prior"]}. {ran}

Each q(pi, mu, tau) is scored from one set of {st["estimator_num_samples"]} draws (shared
key) twice: the **collapsed ELBO** (z summed out, what TraceEnum_ELBO maximises; ELBO\\*c =
{p["reference_collapsed_elbo"]:.3f}, the best final value of any run) and the **mean-field
ELBO** with the optimal q(z) (what VMP maximises; best final {p["reference_meanfield_elbo"]:.3f}).
Loop times as in `benchmarks/README.md` (BayesPy's iterations timed one by one). Thresholds
are below ELBO\\*c, "own final" ones below the run's own last value; "converged at":
{st["convergence_rule"]}.

## Headline

{headline(p)}

## All runs

{D.table(COLUMNS, p["methods"])}

autocvi schedule:

```
{p["autocvi_schedule"]}
```
"""


def panels(plt, p):
    ref, methods = p["reference_collapsed_elbo"], p["methods"]
    out = D.gap_panels(methods, ref, "collapsed", "ELBO*c - collapsed ELBO(q) [nats; floor 1e-3]")
    lines = D.objective_lines(methods, 50)
    out.append({"lines": lines, "log": "x", "ylim": (ref - 60, ref + 5), "legend": 6})
    out[-1].update(xlabel="iteration", ylabel="native objective (SVI: 50-step mean)")
    return out


main = D.main_of(lambda part, quick: run(quick), ["iris"])
