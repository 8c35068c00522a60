"""``fit``'s refit of coupled small globals in float32, the precision users get by default
(``tests/test_coupling_warning.py`` holds the float64 and NUTS tests of the same model)."""

import warnings

import numpy as np
from test_coupling_warning import group_precisions, group_precisions_data

import autocvi
from autocvi.infer.convergence import FitWarning


def test_the_refit_is_kept_in_float32():
    data = group_precisions_data()
    mean_field = autocvi.fit(group_precisions, data, check=False, progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = autocvi.fit(group_precisions, data, progress_bar=False)
    assert np.asarray(result.posterior["mu"].mean).dtype == np.float32
    assert result.diagnostics.refit.startswith("refit with prec_theta ")
    assert result.diagnostics.refit.endswith(", kept")
    assert result.elbo_final > mean_field.elbo_final
    messages = [str(w.message) for w in caught if issubclass(w.category, FitWarning)]
    assert not any(m.startswith("q treats") for m in messages)
