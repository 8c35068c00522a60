"""What each zoo model is expected to meet: read by ``tests/test_zoo.py`` (which asserts
it) and ``benchmarks/zoo.py`` (which prints the reasons in the zoo table).

The default bars (issue 13): ELBO >= SVI's polished ELBO - 0.5 nat, max |z| of
posterior means against NUTS <= 0.1, median sd ratio in [0.9, 1.1]. A model listed
here says why its q family cannot meet them and what it must meet instead.
"""

# Where the family cannot represent the posterior: (max |z| bar, sd-ratio bar or
# None, sites left out of the z bar, why).
OUT_OF_REACH = {
    # Monte Carlo messages on a posterior piled against an edge: over rng_key 0-4 q's means
    # are 0.055-0.087 sd from NUTS's (0.057-0.079 from the traced draw it started at
    # before its prior draws were valid candidates), and 4,000 draws add 0.016 sd
    "mixture_empty_component": (
        0.15,
        (0.9, 1.1),
        (),
        "the empty weight's posterior piles against 0: q's Gaussian on its logit is 1.1-1.3x "
        "too wide (warned on some keys) and Monte Carlo noise moves the means by up to 0.09 sd",
    ),
    "eight_schools": (0.5, None, (), "a funnel: tau's posterior is skewed on the log scale"),
    "gp_latent_lengthscale": (
        0.5,
        None,
        ("ls",),
        "the length-scale posterior is skewed; q's Gaussian on log ls is under-dispersed",
    ),
    # (studentt_intercept_regression, negbin_randhie, ordinal_anes96 and
    # fertility_random_slopes were here for Monte Carlo noise of 0.1-0.15 sd; antithetic
    # draws in the Monte Carlo messages brought them to 0.04-0.06.)
    # fit's refit puts the Gamma precisions in the (offset, level) joint Gaussian (mean-field
    # VMP had their sds at 0.52-0.56 of NUTS's and tau_obs's mean 0.17 sd off)
    "local_level": (
        0.15,
        None,
        (),
        "Gamma precisions refitted in the (offset, level) joint Gaussian (a log-normal q): "
        "the taus' sds are 0.76-0.78 of NUTS's (mean-field VMP: 0.52-0.56), warned",
    ),
    # the same refit: tau in the walk's joint Gaussian (mean-field: tau's sd half NUTS's)
    "poisson_random_walk": (
        0.3,
        None,
        (),
        "Gamma precision refitted in the walk's joint Gaussian: tau's sd about 0.56 of "
        "NUTS's (mean-field VMP: 0.49), warned",
    ),
    # issue 12's reproducer: mean-field had the amplitude's sd at 0.02 of NUTS's (mean 0.76
    # against 2.9); the joint Gaussian over (log amplitude, v) holds the coupling
    "gp_whitened_amplitude": (
        0.5,
        None,
        (),
        "a GP amplitude's posterior is skewed on the log scale: its sd is 0.77 of NUTS's and "
        "its mean 0.45 sd low (SVI's AutoMultivariateNormal: 0.70 and 0.59), warned too "
        "narrow; the whitened values are within 0.1 sd (sd ratios 0.90-1.05)",
    ),
    # discrete assignments are mean-field with the component parameters (VMP): the
    # parameters' sds are 10-20% under NUTS's
    "iris_mixture": (0.3, None, (), "mean-field between discrete assignments and components"),
    "poisson_mixture": (0.1, None, (), "mean-field between discrete assignments and rates"),
    "lda": (
        1.0,
        None,
        (),
        "VMP mean-field between topic assignments and phi/theta: sds 0.6-0.7 of NUTS's "
        "(NUTS sums the assignments out), means up to 0.8 sd off",
    ),
    # Not scored on the means (None): only the ELBO bar applies.
    "bnn_moons": (
        None,
        None,
        (),
        "a BNN posterior is multimodal and far from Gaussian (hidden units interact); "
        "q's ELBO beats SVI's by 0.3 nat but means are up to 1.4 NUTS sd off, sds 0.7",
    ),
    "measurement_error": (
        1.0,
        None,
        (),
        "y ~ N(a + b x, sigma) with latent x is bilinear in (b, x): sigma's posterior is "
        "curved; SVI's AutoMultivariateNormal is 0.54 sd off with sd ratio 0.34 as well",
    ),
    "garch11": (
        0.5,
        None,
        (),
        "alpha0 and beta1 are skewed against the stationarity bound beta1 < 1 - alpha1: sd "
        "ratios 0.6-0.8, means up to 0.4 sd off (SVI's AutoMultivariateNormal: 2.0 sd)",
    ),
    "gp_regression_marginal": (
        0.16,
        None,
        (),
        "LogNormal(0, 10) kernel variance: its posterior is skewed on the log scale (sd "
        "ratio 0.35, as SVI's AutoMultivariateNormal: max|z| 0.11)",
    ),
    "logistic_halfcauchy_ionosphere": (
        0.3,
        None,
        (),
        "half-Cauchy global scale over 34 weights (a funnel): tau's sd is 0.65 of NUTS's, "
        "means up to 0.22 sd off (SVI's AutoMultivariateNormal: 0.24)",
    ),
    "gaussian_mixture_ordered": (
        0.2,
        None,
        (),
        "ordered component means: the posterior is not Gaussian on the ordered transform's "
        "coordinates (sd ratios 0.62-0.9), warned too narrow; the ELBO beats SVI's by 8 nats",
    ),
    "stochastic_volatility": (
        0.75,
        None,
        (),
        "centred AR(1) log-variance with latent sigma (a funnel): the best Gaussian q "
        "narrows sigma (sd 0.15-0.2 of NUTS's) and shifts sigma and phi by up to 0.5 sd; "
        "the ELBO beats SVI's by 12 nats (SVI's phi is 4 sd off)",
    ),
    # fit's refit: the coupling check finds mean-field Gamma U and V too narrow (means
    # 0.7 sd off, 1.6 nat below SVI's ELBO), so U and V share one joint Gaussian
    "poisson_factorisation": (
        0.2,
        (0.9, 1.1),
        (),
        "Gamma factors refitted in one joint Gaussian on (log U, log V): the posterior's "
        "ridge (U_k c, V_k / c) is curved there; means up to 0.12 sd off (mean-field "
        "Gamma: 0.7), warned (importance)",
    ),
    "china_smoking_meta": (
        None,
        None,
        (),
        "centred hierarchy with a small tau (a funnel): tau is 0.7 sd off and its sd "
        "half NUTS's, the city effects up to 0.5 sd off; the ELBO matches SVI's",
    ),
    # from a new-user sweep: textbook models as first written
    "rats_beta_binomial": (
        0.35,
        (0.9, 1.1),
        (),
        "Pareto(1, 1.5) concentration kappa of a beta-binomial hierarchy: mean-field with "
        "theta, kappa's sd is 0.46 of NUTS's and its mean 0.27 sd low, warned (coupling and "
        "too narrow); SVI's AutoMultivariateNormal: 0.76 and 0.32. The ELBO beats SVI's by "
        "0.6 nat; theta within 0.09 sd",
    ),
    "horseshoe_regression": (
        0.5,
        None,
        (),
        "a horseshoe (half-Cauchy global and local scales: funnels, and lam has no finite "
        "posterior variance): tau 0.44 sd high, the null weights up to 0.31 sd off, lam's "
        "sds 0.3-0.7 of NUTS's (SVI's AutoMultivariateNormal: 0.55, 0.34, 0.2-0.6), "
        "warned (importance: misses part of the posterior); the ELBO matches SVI's",
    ),
    "random_slopes_lkj": (
        0.15,
        (0.9, 1.1),
        (),
        "LKJCholesky correlation and half-normal scales of correlated random effects: "
        "L[1, 1] (bounded by 1) 0.12 sd off, sd[1] 0.11 sd off, the scales' and mu's sds "
        "0.82-0.87 of NUTS's (SVI's AutoMultivariateNormal: 0.12, 0.05, 0.84-0.88), warned "
        "too narrow at sd[1]",
    ),
    "binomial_logit_groups": (
        0.3,
        (0.9, 1.1),
        (),
        "centred hierarchy with a half-normal scale (a funnel): s's sd is 0.71 of NUTS's and "
        "its mean 0.21 sd high, the group log odds up to 0.18 sd off (SVI's "
        "AutoMultivariateNormal: 0.66, 0.13, 0.15), warned too narrow; the ELBO matches SVI's",
    ),
}
# Models whose q family falls short of SVI's AutoMultivariateNormal in ELBO: (nats of
# slack, why). Everything else must reach SVI's polished ELBO - 0.5 nat.
ELBO_SHORT: dict[str, tuple] = {}
# Models out of reach in float32 that must say so: raise IllConditionedError (which
# names the fix) or return converged=False with a FitWarning; never converged=True.
LOUD: dict[str, str] = {}
# The models this test asserts: each was fitted and scored against its reference
# before being listed here (a reference added later does not join silently).
ZOO = [
    "logistic_plate_intercept",
    "poisson_glm",
    "studentt_intercept_regression",
    "studentt_robust",
    "negbin_randhie",
    "missing_obs_regression",
    "hierarchical_logit",
    "eight_schools",
    "local_level",
    "poisson_random_walk",
    "gp_latent_lengthscale",
    "iris_mixture",
    "probit_pima",
    "ordinal_anes96",
    "softmax_iris",
    "flat_prior_regression",
    "uncentred_year_regression",
    "collinear_regression",
    "fertility_random_slopes",
    "china_smoking_meta",
    "poisson_mixture",
    "bnn_moons",
    "lda",
    "hierarchical_poisson_cancer",
    "gamma_poisson_hierarchy",
    "conjugate_hierarchy",
    "ar2_sunspots",
    "gp_classification_ionosphere",
    "gp_whitened_amplitude",
    "weibull_survival_heart",
    "measurement_error",
    "garch11",
    "gp_regression_marginal",
    "logistic_halfcauchy_ionosphere",
    "gaussian_mixture_ordered",
    "stochastic_volatility",
    "poisson_factorisation",
    "rats_beta_binomial",
    "horseshoe_regression",
    "zip_counts",
    "censored_weibull",
    "random_slopes_lkj",
    "binomial_logit_groups",
    "mixture_empty_component",
    "normal_mixture_assignments",
    "sir_epidemic_scan",
]
