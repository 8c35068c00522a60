"""``docs/benchmarks.md`` from the benchmarks' results: the headline sections of each
``benchmarks/results/<name>.md`` with its plot, between protocol texts
(``tests/test_docs.py`` checks the committed page).

    python -m benchmarks report
"""

import re
from pathlib import Path

from . import driver as D

DOC = D.ROOT / "docs" / "benchmarks.md"

INTRO = """# Benchmark results

Every benchmark runs autocvi and its peers **in one process on the same data** on one driver
(`benchmarks/driver.py`: a `Method` protocol implemented for autocvi through its public `CVI`
API, NumPyro SVI and BayesPy; one timed runner; one Monte Carlo ELBO scorer with common random
numbers; tables and plots declared per benchmark), and writes a JSON record, a markdown report
and a plot to `benchmarks/results/`. How time is measured (compilation and setup excluded from
loop times and reported separately, fastest of repeated identical runs) and every setting are
in [`benchmarks/README.md`](../benchmarks/README.md) and in each report. This page is
generated from those reports by `python -m benchmarks` (which runs every benchmark, then
`benchmarks/report.py`): the tables below are copied from the reports, not typed. autocvi on
the model zoo (`tests/zoo`) against NUTS is on [its own page](zoo.md) (`python -m benchmarks zoo`).

Regenerate everything with `pip install -e ".[benchmarks]" && python -m benchmarks`
(sized for under 30 minutes on 2 CPU cores), or one part, e.g.
`python -m benchmarks gp_classification:sonar`.

Reading the ratios: an *iteration* is one CVI sweep or one Adam step; "ratio" is the
peer's cost over autocvi's to reach the same ELBO threshold (for the factor models: the same
test loss, within 5% or 1% of the best); "> Nx (SVI does not reach)"
means no peer setting got there within its budget, so the ratio is at least that budget
over autocvi's cost. Loop times exclude compilation; setup and compile times are in the
full reports. Timings vary with the machine's load (recorded in each JSON).
"""

# Of each report the sections whose headings start with one of COPIED are copied, in the
# report's order, with its plot, under the heading and protocol text declared here: paragraphs
# of "<result name>: <heading>" and the text.
COPIED = ("Ratios", "All methods", "Result", "The paper", "Headline")
SECTIONS_TEXT = """
logistic_regression: Logistic regression: convergence (CVI paper Sec. 7 data)
breast_cancer_scale (683 x 10, intercept added), `w ~ N(0, I)`, D = 11: a weight-space Gaussian
block with Gauss-Hermite messages (`autocvi`), the same engine with Monte Carlo messages
(`autocvi-mc`), and NumPyro SVI with AutoMultivariateNormal and Adam at three learning rates.

logistic_regression_table3: Logistic regression: the CVI paper's Table 3 protocol
Random 50/50 splits; -ELBO on the training half, test log-loss and time for autocvi with
Gauss-Hermite ("CVI-exact"), autocvi with Monte Carlo gradients, and SVI (AutoMultivariateNormal
+ Adam, best of three learning rates), next to the paper's printed numbers.

logistic_regression_wide: Logistic regression with D > N (colon-cancer shape)
Synthetic data shaped like the colon-cancer set of KL-prox Table 2 (N = 62, D = 2000): autocvi's
function-space block (no D x D matrix) against SVI with Adam.

gp_classification_ionosphere: GP classification: ionosphere (PG-SVI Sec. 7.1, Fig. 2)
`f ~ MultivariateNormal(0, K)`, `y ~ Bernoulli(logits=f)`, squared-exponential kernel at the
papers' hyperparameters, float64. autocvi full batch (a function-space Gaussian block), autocvi
minibatched (a subsampled plate: the dense engine), NumPyro SVI with AutoMultivariateNormal and
AutoLowRankMultivariateNormal. The fourth panel is the test log-loss against passes through the
data.

gp_classification_sonar: GP classification: sonar
The same at sonar's published hyperparameters (log l, log sigma) = (-1, 6): a nearly diagonal
kernel with variance e^12, where every method predicts close to 0.5 on the test set and
plain CVI steps contract slowly (hundreds of iterations); autocvi's Anderson-extrapolated steps need about a hundred.

gp_hyperparameters_ionosphere: GP classification: hyperparameters by the ELBO (KL-prox Table 3 protocol), ionosphere
Random 50/50 splits; all 225 points of the papers' (log l, log sigma) grid fitted per split, the
highest ELBO chosen, test log-loss reported next to the published numbers; and the two learned
as `numpyro.param` sites by variational EM in one fit.

gp_hyperparameters_sonar: GP classification: hyperparameters by the ELBO, sonar
As above, for sonar.

gp_regression_em: GP regression: hyperparameters learned by variational EM against SVI
The motorcycle data; length-scale, amplitude and noise as `numpyro.param` sites. autocvi's EM
(M-steps on the dual bound) against SVI learning them jointly with AutoMultivariateNormal;
both against the exact type-II maximum likelihood.

svgp_banana: Sparse GP classification: hyperparameters by EM against SVI (t-SVGP Fig. 1-2)
The banana toy (400 points), m = 10 fixed inducing inputs, amplitude and length-scale as
`numpyro.param` sites from (1, 1), written with the exact SVGP conditional (integrated by the
planner). autocvi's EM on the dual and the standard bound against SVI (whitened and unwhitened
AutoMultivariateNormal q(u), Adam), all scored by the exact SVGP ELBO.

svgp_minibatch: Minibatched sparse GP on 100,000 points: site memory, tied sites and SVI
A synthetic binary task (100,000 training and 10,000 test points, offline stand-in for
t-SVGP's large-data experiment), m = 50 fixed inducing inputs, a fixed kernel, B = 1,000, the
model of `examples/minibatch_sparse_gp.py`. autocvi with its default site memory (one site per
point, SAG estimate of the message) and with tied sites (`site_memory=False`) against SVI
(whitened and unwhitened AutoMultivariateNormal q(u), Adam at three rates); test NLPD against
wall-clock seconds.

svgp_multiclass: Minibatched multiclass sparse GP: digits, 10 classes (issue 15)
scikit-learn's digits (1,437 training and 360 test images, the offline stand-in for MNIST),
m = 100 fixed k-means inducing inputs, a fixed kernel, B = 200: `u ~ MultivariateNormal(0,
Kuu)` in a plate of 10 classes and a softmax likelihood in a subsampled plate. autocvi with its
defaults (cubature messages through the 10 logits, K-vector site memory) against SVI
(AutoNormal over u and over whitened v, AutoMultivariateNormal over u; Adam at three rates);
test NLPD against wall-clock seconds, and the full-data ELBO.

svgp_uci_airfoil: Sparse GP regression with learned inducing inputs: airfoil, 5-fold (t-SVGP Fig. 3)
Airfoil self-noise (1,500 points, 5 inputs), m = 50 inducing inputs, ARD kernel and noise, all
`numpyro.param` sites learned: one `autocvi.fit` per fold (variational EM on the dual bound; the
first fold compiles, the others reuse the program) against SVI (whitened and unwhitened
AutoMultivariateNormal q(u), params jointly by Adam); test NLPD on the held-out fold.

svgp_uci_diabetes: Sparse GP classification with learned inducing inputs: Pima diabetes, 5-fold (t-SVGP Fig. 3)
The same protocol on Pima diabetes (765 points, 8 inputs), Bernoulli likelihood.

dlm: Direct loss minimisation for sparse GP regression (DLM paper Sec. 5)
Four regression sets, 67/8/25 splits, an SVGP with m = 50 whose kernel, noise and inducing
inputs are learned once by EM on the ELBO and then held; the ELBO, the beta-ELBO, log-loss
DLM (`autocvi.DLM`) with beta chosen on the validation split, and square-loss DLM with beta
chosen by the validation squared error; test NLPD, squared error and 90% coverage. At DLM's beta, autocvi's natural-gradient steps against the paper's Adam training, by
iterations to Adam's final test NLPD.

dlm_nonconjugate: Direct loss minimisation for sparse GP classification and counts (DLM paper Sec. 6)
Probit classification (ionosphere, breast_cancer_scale) and Poisson counts (statsmodels' RAND
doctor visits, 1,000 rows) with the same protocol; at DLM's beta, the paper's bMC and uPS
gradient estimators (10 draws) in place of the quadrature's gradients. Test NLL, error and
calibration. At DLM's beta, natural-gradient DLM against Adam (autocvi's `optimizer=`), by
iterations to Adam's final test NLL.

dlm_minibatch: Direct loss minimisation with minibatches on 100,000 points (DLM paper Sec. 6)
The synthetic binary task of `examples/minibatch_sparse_gp.py` (offline stand-in for the
paper's airline data), m = 50 fixed inducing inputs, B = 1,000, beta in {0.1, 1, 10} as in the
paper (no selection): the beta-ELBO and log-loss DLM by natural-gradient steps, and DLM by
Adam (`optimizer=optax.adam(0.01)`, 20 epochs); test NLL, and iterations to Adam's final test NLL.

gaussian_mixture: Gaussian mixture: autocvi's VMP against BayesPy and SVI
iris, 3 components, conjugate priors: every message is exact, so CVI is VMP. BayesPy runs VMP on
the same mean-field family; SVI enumerates z (TraceEnum_ELBO).

factor_models_poisson_gamma: Poisson-gamma matrix factorisation (CVI paper App. K)
scikit-learn digits pixel counts standing in for MNIST; Gamma posteriors with Fisher-route
natural-gradient messages against SVI (AutoNormal, Adam); test reconstruction loss against time.

factor_models_gamma: Gamma factor model (CVI paper App. J)
Synthetic data from the model; the same comparison.

cold_start: Time to first answer: cold and warm fits against SVI (issue 14)
The model zoo, each model in a fresh process on one core: autocvi's first `fit` (trace, plan,
compilation, loop) and a second one, against SVI's compile time and its compiled loop to within
1 nat of the better optimum. Produced by the zoo's runs (`python -m benchmarks cold_start`).
"""


def _section(paragraph: str) -> tuple[str, str, str]:
    first, *text = paragraph.split("\n")
    name, heading = first.split(": ", 1)
    return heading, " ".join(text), name


SECTIONS = [_section(p) for p in SECTIONS_TEXT.strip().split("\n\n")]

OUTRO = """## Accuracy against the exact posterior

The slow tests (`tests/test_gaussian_blocks_slow.py`, run by CI) compare autocvi's GP
posteriors with NUTS on the same split and hyperparameters; test log-loss in bits, autocvi
vs NUTS: ionosphere 0.419 vs 0.414, sonar 0.926 vs 0.940, digits 3 vs 5 0.070 vs 0.075. The
conjugate models are checked against closed-form posteriors (`tests/test_vmp.py`,
`tests/test_fit.py`).
"""


def render(results: Path = D.RESULTS) -> str:
    parts, missing = [INTRO.rstrip()], []
    for title, text, name in SECTIONS:
        md_path = results / f"{name}.md"
        if not md_path.exists():
            missing.append(name)
            continue
        body = [f"## {title}", "", text, ""]
        split = re.split(r"^## (.*)$", md_path.read_text(), flags=re.M)[1:]  # heading, body, ...
        for heading, section in zip(split[::2], split[1::2]):
            if heading.startswith(COPIED):
                body += [f"#### {heading.strip()}", "", section.strip(), ""]
        if (results / f"{name}.png").exists():
            body += [f"![{title}](../benchmarks/results/{name}.png)", ""]
        body.append(f"Full report: [`{name}.md`](../benchmarks/results/{name}.md).")
        parts.append("\n".join(body).rstrip())
    parts.append(OUTRO.rstrip())
    if missing:
        names = ", ".join(f"`{m}`" for m in missing)
        run = "Run `python -m benchmarks` to produce them."
        parts.append(f"## Not generated\n\nNo result files for: {names}. {run}")
    return "\n\n".join(parts) + "\n"


def main(argv=None):
    DOC.write_text(render())
    print(f"wrote {DOC.relative_to(D.ROOT)}")
