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


def test_fit_warnings_point_at_the_callers_line_and_others_stay_where_raised(monkeypatch):
    """fit records the warnings of its fits and issues the kept fit's again: its own
    FitWarnings at the line that called fit, a library's warning (a deprecation) where it
    was raised, so that the default filters treat it as before."""
    import importlib
    import inspect

    fit_module = importlib.import_module("autocvi.infer.fit")
    once = fit_module._fit_once

    def with_a_library_warning(*args, **kwargs):
        warnings.warn("a library's deprecation", DeprecationWarning, stacklevel=1)
        return once(*args, **kwargs)

    monkeypatch.setattr(fit_module, "_fit_once", with_a_library_warning)
    warn_line = inspect.getsourcelines(with_a_library_warning)[1] + 1
    data = {"g": np.zeros(3, int), "y": np.ones(3)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call_line = inspect.currentframe().f_lineno + 1
        autocvi.fit(group_precisions, data, num_steps=1, progress_bar=False)
    fit_warnings = [w for w in caught if issubclass(w.category, FitWarning)]
    (library,) = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert fit_warnings  # one step: not converged
    assert all(w.filename == __file__ and w.lineno == call_line for w in fit_warnings)
    assert library.lineno == warn_line
