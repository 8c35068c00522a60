"""The exact SVGP conditional in float32, the precision users get by default (issue 15).

The float64 oracles are in ``test_sparse_gp.py``; here the same Bernoulli SVGP, with f
integrated into y's expectation, reaches the optimum of the direct maximisation of the
SVGP ELBO to float32 accuracy, and the rule's estimates do not depend on x64.
"""

import numpy as np
import pytest
from test_sparse_gp import svgp, svgp_classification_optimum, svgp_inputs  # noqa: E402

import autocvi


def test_float32_classification_reaches_the_svgp_optimum():
    inputs = svgp_inputs(n=100, m=10, classify=True)
    inputs = {k: np.asarray(v, np.float32) for k, v in inputs.items()}
    inputs["likelihood"] = "bernoulli"
    result = autocvi.fit(svgp, inputs, progress_bar=False)
    assert [it.latent for it in result.schedule.integrated] == ["f"]
    assert result.converged
    mean, cov, elbo = svgp_classification_optimum(
        *(np.asarray(inputs[k], np.float64) for k in ("Kuu", "Kfu", "kff", "y"))
    )
    q = result.posterior["u"]
    sd = np.sqrt(np.diag(cov))
    assert np.max(np.abs(np.asarray(q.mean) - mean) / sd) < 0.02
    assert np.max(np.abs(np.sqrt(np.diag(np.asarray(q.covariance_matrix))) / sd - 1)) < 0.02
    assert result.elbo[-1] == pytest.approx(elbo, abs=0.01)
