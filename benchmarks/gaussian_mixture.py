"""Gaussian mixture on iris: autocvi (VMP) vs BayesPy (VMP) vs NumPyro SVI (TraceEnum_ELBO).

iris standardised (150 x 4), K = 3: ``pi ~ Dirichlet(1)``, ``mu_k ~ N(0, I_4)``,
``tau_kd ~ Gamma(2, 1)``, ``z_n ~ Categorical(pi)``, ``x_n ~ N(mu[z_n], 1/sqrt(tau[z_n]))``.
Every q(pi, mu, tau) is scored from one set of draws (shared key) twice: the collapsed ELBO
(z summed out: what TraceEnum_ELBO maximises) and the mean-field ELBO with the optimal q(z)
(what VMP maximises).

    python -m benchmarks gaussian_mixture [--quick]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer.autoguide import AutoNormal
from numpyro.optim import Adam

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


def gmm(X, K=3):
    N, D_ = X.shape
    pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(K)))
    with numpyro.plate("components", K):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0).expand([D_]).to_event(1))
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0).expand([D_]).to_event(1))
    with numpyro.plate("data", N):
        z = numpyro.sample("z", dist.Categorical(pi))
        numpyro.sample("x", dist.Normal(mu[z], 1.0 / jnp.sqrt(tau[z])).to_event(1), obs=X)


def gmm_marginal(X, K=3):
    N, D_ = X.shape
    pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(K)))
    with numpyro.plate("components", K):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0).expand([D_]).to_event(1))
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0).expand([D_]).to_event(1))
    with numpyro.plate("data", N):
        comp = dist.Normal(mu, 1.0 / jnp.sqrt(tau)).to_event(1)
        numpyro.sample("x", dist.MixtureSameFamily(dist.Categorical(pi), comp), obs=X)


def load_data(K=3):
    from sklearn.datasets import load_iris
    from sklearn.preprocessing import StandardScaler

    return {"X": jnp.asarray(StandardScaler().fit_transform(load_iris().data), jnp.float32), "K": K}


class MixtureEstimator:
    """Collapsed and mean-field ELBOs of q(pi, mu, tau) from one set of draws (shared key)."""

    def __init__(self, data, num_samples, rng_key, chunk=4096):
        X, K = data["X"], data["K"]
        self.num_samples, self.chunk, self.key = num_samples, chunk, jax.random.PRNGKey(rng_key)

        def per_draw(z):
            lc = numpyro.infer.util.log_density(gmm_marginal, (), {"X": X, "K": K}, z)[0]
            prior = (
                dist.Dirichlet(jnp.ones(K)).log_prob(z["pi"])
                + dist.Normal(0.0, 1.0).log_prob(z["mu"]).sum()
            )
            prior = prior + dist.Gamma(2.0, 1.0).log_prob(z["tau"]).sum()
            comp = dist.Normal(z["mu"], 1.0 / jnp.sqrt(z["tau"])).log_prob(X[:, None, :]).sum(-1)
            return lc, prior, jnp.log(z["pi"]) + comp

        self._per_draw = jax.jit(jax.vmap(per_draw))

    def __call__(self, q) -> dict:
        if isinstance(q, dict):
            q = D.independent_q({k: v for k, v in q.items() if k != "z"})
        coll, pq, lsum = [], [], 0.0
        for start in range(0, self.num_samples, self.chunk):
            z, log_q = q(
                jax.random.fold_in(self.key, start), min(self.chunk, self.num_samples - start)
            )
            lc, prior, lnk = self._per_draw({k: z[k] for k in ("pi", "mu", "tau")})
            lq = np.asarray(log_q, np.float64)
            coll.append(np.asarray(lc, np.float64) - lq)
            pq.append(np.asarray(prior, np.float64) - lq)
            lsum = lsum + np.asarray(lnk, np.float64).sum(0)
        c, pq = np.concatenate(coll), np.concatenate(pq)
        lbar = lsum / self.num_samples  # E_q[log pi_k + log N(x_n | mu_k, tau_k)], (N, K)
        lse = np.sum(np.logaddexp.reduce(lbar, axis=1))
        if not (np.all(np.isfinite(c)) and np.all(np.isfinite(pq))):
            return dict.fromkeys(("collapsed", "collapsed_se", "meanfield"), float("nan"))
        return {
            "collapsed": c.mean(),
            "collapsed_se": c.std(ddof=1) / np.sqrt(c.size),
            "meanfield": lse + pq.mean(),
        }


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


def converged_at(trace, rtol=1e-6):
    return next(
        (
            i + 1
            for i in range(1, len(trace))
            if abs(trace[i] - trace[i - 1]) <= rtol * max(1.0, abs(trace[i]))
        ),
        None,
    )


def run(quick=False):
    from numpyro.contrib.funsor import config_enumerate
    from numpyro.infer import TraceEnum_ELBO

    st = dict(SETTINGS)
    if quick:
        st.update(
            autocvi_num_steps=60, autocvi_seeds=[0, 1], bayespy_num_steps=60, bayespy_seeds=[0, 1]
        )
        st.update(svi_num_steps=2000, svi_grid_points=30, estimator_num_samples=4096)
    data = load_data(st["K"])
    est = MixtureEstimator(data, st["estimator_num_samples"], st["estimator_rng_key"])
    runs, grids = {}, {}
    # Does rng_key change autocvi's initialisation? If not, other seeds are the same run.
    import autocvi

    cvi = autocvi.CVI(gmm)
    s0, s1 = (cvi.init(k, **data).state.natural for k in (0, 1))
    init_diff = max(
        float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(s0), jax.tree.leaves(s1))
    )
    seeds = st["autocvi_seeds"] if init_diff > 1e-4 else st["autocvi_seeds"][:1]
    n = st["autocvi_num_steps"]
    for seed in seeds:
        m = D.AutocviMethod(f"autocvi-seed{seed}", rng_key=seed)
        grids[m.label] = sorted(set(range(31)) | set(D.log_grid(n, 40)))
        print(f"[{NAME}] {m.label}: {n} iterations")
        runs[m.label] = D.run(m, gmm, data, n, keep=grids[m.label])
    fit = D.timed_fit(gmm, data, rng_key=st["autocvi_seeds"][0])
    fit.update(est(fit.pop("result").posterior))
    bp_error = D.bayespy_missing()
    if bp_error is None:
        nb = st["bayespy_num_steps"]
        for seed in st["bayespy_seeds"]:
            m = D.BayesPyMethod(f"bayespy-seed{seed}", build_bayespy, seed, "BayesPy VB")
            grids[m.label] = sorted(set(range(1, 31)) | set(D.log_grid(nb, 40)))
            print(f"[{NAME}] {m.label}: {nb} iterations")
            try:
                runs[m.label] = D.run(m, None, data, nb, keep=grids[m.label])
            except Exception as e:  # noqa: BLE001
                bp_error = f"{type(e).__name__}: {e}"
                break
    enum_model = config_enumerate(gmm)
    ns = st["svi_num_steps"]
    for lr in st["svi_learning_rates"]:
        label = f"svi-adam-{lr:g}"
        print(f"[{NAME}] {label}: {ns} steps")
        m = D.SVIMethod(
            label,
            lambda mod: AutoNormal(handlers.block(mod, hide=["z"])),
            Adam(lr),
            TraceEnum_ELBO(max_plate_nesting=1),
        )
        grids[label] = D.log_grid(ns, st["svi_grid_points"])
        runs[label] = D.run(m, enum_model, data, ns, keep=grids[label])
    methods = {}
    for label, r in runs.items():
        s = D.score_run(r, est, grids[label])
        rec = D.timing(
            r,
            {
                "iters": s.iters,
                "collapsed": s.values["collapsed"],
                "meanfield": s.values["meanfield"],
            },
        )
        rec.update(
            collapsed_se=s.values["collapsed_se"][-1],
            final_collapsed=s.final("collapsed"),
            final_meanfield=s.final("meanfield"),
        )
        if r.method.kind != "svi":
            rec["converged_at"] = converged_at(r.objective)
            rec["converged_time"] = s.time_at(rec["converged_at"])
        methods[label] = rec
    ref_c = max(m["final_collapsed"] for m in methods.values() if np.isfinite(m["final_collapsed"]))
    ref_m = max(m["final_meanfield"] for m in methods.values() if np.isfinite(m["final_meanfield"]))
    for m in methods.values():
        for key, target in (("own", m["final_collapsed"]), ("ref", ref_c)):
            m[f"hits_{key}"] = {
                str(t): D.first_hit(m["iters"], m["collapsed"], target - t)
                for t in st["thresholds_nats"]
            }
            m[f"hits_{key}_time"] = {
                t: None if i is None else i * m["per_iter_time"]
                for t, i in m[f"hits_{key}"].items()
            }
    payload = {
        "benchmark": NAME,
        "settings": st,
        "environment": D.environment(),
        "bayespy_error": bp_error,
    }
    payload.update(
        autocvi_init_max_abs_difference_key0_vs_key1=init_diff, reference_collapsed_elbo=ref_c
    )
    payload.update(reference_meanfield_elbo=ref_m, autocvi_fit_defaults=fit, methods=methods)
    payload["autocvi_schedule"] = str(runs[next(iter(runs))].method.schedule)
    md = markdown(payload)
    D.write(NAME, payload, md, panels(payload), "Gaussian mixture, iris (N=150, D=4, K=3)")
    print(md)
    return payload


COLUMNS = [
    ("run", lambda k, m: k, None),
    ("converged at (rel. change < 1e-6)", "converged_at", "d"),
    ("loop s to converge", "converged_time", ".3g"),
    ("iters to own final −1 nat", lambda k, m: m["hits_own"]["1.0"], "d"),
    ("iters to own final −0.1 nat", lambda k, m: m["hits_own"]["0.1"], "d"),
    ("iters to ELBO*c −1 nat", lambda k, m: m["hits_ref"]["1.0"], "d"),
    ("loop s", lambda k, m: m["hits_ref_time"]["1.0"], ".3g"),
    ("iters to ELBO*c −0.1 nat", lambda k, m: m["hits_ref"]["0.1"], "d"),
    ("loop s", lambda k, m: m["hits_ref_time"]["0.1"], ".3g"),
    ("final mean-field ELBO", "final_meanfield", ".3f"),
    (
        "final collapsed ELBO (± se)",
        lambda k, m: f"{m['final_collapsed']:.3f} ± {m['collapsed_se']:.3f}",
        None,
    ),
    ("final native objective", lambda k, m: float(m["objective"][-1]), ".3f"),
    *D.TIMING_COLUMNS,
]


def markdown(p):
    st, runs, f = p["settings"], p["methods"], D.fmt

    def best(kind, key="final_meanfield"):
        c = {k: m for k, m in runs.items() if m["kind"] == kind and np.isfinite(m[key])}
        return max(c, key=lambda k: c[k][key]) if c else None

    lines, a, b, s = [], best("autocvi"), best("bayespy"), best("svi", "final_collapsed")
    ma = runs[a]
    lines.append(
        f"- autocvi best run ({a}): mean-field ELBO {ma['final_meanfield']:.3f} (engine {float(ma['objective'][-1]):.3f}), "
        f"converged in {ma['converged_at']} iterations, {f(ma['converged_time'], '.3g')} s loop "
        f"({ma['per_iter_time'] * 1e3:.3g} ms/iteration), compile {ma['compile_time']:.1f} s."
    )
    if b:
        mb = runs[b]
        lines.append(
            f"- BayesPy best run ({b}): mean-field ELBO {mb['final_meanfield']:.3f} (BayesPy's own {float(mb['objective'][-1]):.3f}), "
            f"converged in {mb['converged_at']} iterations, {f(mb['converged_time'], '.3g')} s ({mb['per_iter_time'] * 1e3:.3g} ms/iteration)."
        )
        lines.append(
            f"- Per-iteration time ratio BayesPy / autocvi: {mb['per_iter_time'] / ma['per_iter_time']:.2f}x; mean-field ELBO "
            f"difference autocvi − BayesPy: {ma['final_meanfield'] - mb['final_meanfield']:+.4f} nats."
        )
    else:
        lines.append(f"- BayesPy: not run ({p['bayespy_error']}).")
    ms = runs[s]
    lines.append(
        f"- Best SVI ({s}): collapsed ELBO {ms['final_collapsed']:.3f}, mean-field ELBO of its q(pi, mu, tau) "
        f"{ms['final_meanfield']:.3f}; reaches ELBO*c − 1 nat at step {f(ms['hits_ref']['1.0'], 'd')}, − 0.1 nat at step "
        f"{f(ms['hits_ref']['0.1'], 'd')} ({ms['per_iter_time'] * 1e3:.3g} ms/step)."
    )
    fi = p["autocvi_fit_defaults"]
    lines.append(
        f"- `autocvi.fit` with defaults (seed {st['autocvi_seeds'][0]}): {fi['num_steps']} iterations, converged={fi['converged']}, "
        f"engine ELBO {fi['final_elbo_engine']:.3f}, mean-field ELBO (common estimator) {fi['meanfield']:.3f}, "
        f"{fi['wall_time_including_compile']:.2f} s in the loop including compilation, {fi['total_call_time']:.2f} s for the whole call."
    )
    if p["autocvi_init_max_abs_difference_key0_vs_key1"] <= 1e-4:
        lines.append(
            "- autocvi's initialisation does not depend on `rng_key`; one autocvi run is reported."
        )
    return f"""# Gaussian mixture (iris, K=3): autocvi VMP vs NumPyro SVI (TraceEnum_ELBO) vs BayesPy

{D.env_line(p["environment"], NAME)}

Data: {st["data"]}. Prior: {st["prior"]}. {"BayesPy ran (same mean-field family and objective as autocvi)." if b else f"**BayesPy could not be used**: {p['bayespy_error']}"}

Each q(pi, mu, tau) is scored from one set of {st["estimator_num_samples"]} draws (shared key) in two
ways: the **collapsed ELBO** (z summed out; what TraceEnum_ELBO maximises; ELBO\\*c =
{p["reference_collapsed_elbo"]:.3f}, the best final value of any run) and the **mean-field ELBO**
with the optimal q(z) (what VMP maximises; best final {p["reference_meanfield_elbo"]:.3f}).
Loop times exclude compilation and setup: autocvi's per-iteration time is `CVI.run`'s
compiled loop (in brackets one `CVI.update` with its ELBO fetched); BayesPy's iterations are
timed one by one; SVI's is its `lax.scan` of `svi.update`; fastest of 3 runs each. "Own final"
thresholds are against the run's own last value (collapsed estimator); "converged at" uses
the native ELBO with {st["convergence_rule"]}.

## Headline

{chr(10).join(lines)}

## All runs

{D.table(COLUMNS, runs)}

autocvi schedule:

```
{p["autocvi_schedule"]}
```
"""


def panels(p):
    ref, out = p["reference_collapsed_elbo"], [[], [], []]
    for label, m in p["methods"].items():
        it = np.maximum(np.asarray(m["iters"], float), 0.8)
        gap = np.maximum(ref - np.asarray(m["collapsed"], float), 1e-3)
        out[0].append((it, gap, label, "-"))
        out[1].append((np.maximum(it * m["per_iter_time"], 1e-5), gap, label, "-"))
        obj = np.asarray(m["objective"], float)
        if m["kind"] == "svi":
            obj = np.convolve(obj, np.ones(50) / 50, mode="valid")
        out[2].append((np.arange(1, len(obj) + 1), obj, label, "-"))
    gp = {
        "log": "xy",
        "hlines": [(1.0, "--"), (0.1, ":")],
        "ylabel": "ELBO*c - collapsed ELBO(q) [nats; floor 1e-3]",
    }
    return [
        {**gp, "lines": out[0], "xlabel": "iteration"},
        {**gp, "lines": out[1], "xlabel": "wall-clock s (loop, compile excluded)", "legend": 0},
        {
            "lines": out[2],
            "log": "x",
            "ylim": (ref - 60, ref + 5),
            "xlabel": "iteration",
            "ylabel": "native objective (SVI: 50-step mean)",
            "legend": 6,
        },
    ]


def main(argv=None):
    run(quick="--quick" in (argv or []))
