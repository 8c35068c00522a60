"""``fit``'s refit of coupled latents in float32, the precision users get by default
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


def test_the_importance_check_runs_once_on_the_kept_fit(monkeypatch):
    """With a refit, fit checks q's importance ratios once, on the fit it keeps: the
    refit is decided on the coupling check and the ELBOs, and the check of the dropped
    fit (4,000 draws of the log joint, a program of its own) was 1-2 s of a cold fit."""
    import importlib

    fit_module = importlib.import_module("autocvi.infer.fit")
    real, checked = fit_module.check_importance, []

    def counted(model, data, schedule, *args):
        checked.append(schedule)
        return real(model, data, schedule, *args)

    monkeypatch.setattr(fit_module, "check_importance", counted)
    result = autocvi.fit(group_precisions, group_precisions_data(), progress_bar=False)
    assert result.diagnostics.refit.endswith(", kept")
    assert len(checked) == 1 and checked[0] is result.schedule
    assert result.diagnostics.importance is not None


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


def _poisson_factorisation(Y):
    import numpyro
    import numpyro.distributions as dist

    with numpyro.plate("factors", 2, dim=-1):
        with numpyro.plate("rows", Y.shape[0], dim=-2):
            U = numpyro.sample("U", dist.Gamma(1.0, 1.0))
        with numpyro.plate("cols", Y.shape[1], dim=-2):
            V = numpyro.sample("V", dist.Gamma(1.0, 1.0))
    with numpyro.plate("rows", Y.shape[0], dim=-2), numpyro.plate("entries", Y.shape[1], dim=-1):
        numpyro.sample("Y", dist.Poisson(U @ V.T), obs=Y)


def test_plated_gamma_factors_are_refitted_jointly():
    """A Poisson factorisation written the usual way (Gamma factors in plates): the
    coupling check finds mean-field between U and V too narrow (the posterior follows
    the ridge (U_k c, V_k / c)), and fit refits them in one joint Gaussian on their logs.
    The zoo's 20 x 12 version is scored against NUTS in tests/test_zoo.py (means 0.7 sd
    off before the refit, 0.12 after)."""
    rs = np.random.RandomState(1)
    U = rs.gamma(2.0, 0.2, size=(8, 2)) + np.repeat(np.eye(2) * 2.0, 4, axis=0)
    V = rs.gamma(2.0, 0.2, size=(6, 2)) + np.repeat(np.eye(2) * 2.0, 3, axis=0)
    Y = rs.poisson(U @ V.T).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = autocvi.fit(_poisson_factorisation, {"Y": Y}, progress_bar=False)
    assert result.diagnostics.refit.startswith("refit with ")
    assert result.diagnostics.refit.endswith(", kept"), result.diagnostics.refit
    (group,) = result.schedule.joint
    assert set(group.member_names) == {"U", "V"}
    messages = [str(w.message) for w in caught if issubclass(w.category, FitWarning)]
    assert not any(m.startswith("q treats") for m in messages)
