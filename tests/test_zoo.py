"""The zoo (``tests/zoo/models.py``) against its NUTS and SVI references (issue 13).

Every model with a reference is fitted with autocvi's defaults, in float32 as
users run it, and must either

* meet the bars: ELBO >= SVI's polished ELBO - 0.5 nat (where SVI ran on the same
  objective), max |z| of posterior means against NUTS <= the model's bar (0.1
  where a Gaussian on the unconstrained coordinates represents the posterior),
  median sd ratio in [0.9, 1.1] where q is a joint Gaussian; or
* be listed in ``OUT_OF_REACH`` with its looser bar and the reason (the variational
  family cannot represent the posterior); or
* be listed in ``LOUD``: raise a clear error or return ``converged=False`` with a
  ``FitWarning``.

Never ``converged=True`` with an answer outside its bar. References:
``tests/zoo/regenerate.py``; scoring: ``tests/zoo/scoring.py``.
"""

import sys
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest

import autocvi

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo.expectations import ELBO_SHORT, LOUD, OUT_OF_REACH, ZOO  # noqa: E402
from zoo.models import MODELS  # noqa: E402
from zoo.scoring import has_reference, reference, scores  # noqa: E402


def fit_quietly(model, data):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = autocvi.fit(model, data, progress_bar=False)
    return result, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_zoo_model(name):
    model, data = MODELS[name]()
    if name in LOUD:
        try:
            result, caught = fit_quietly(model, data)
        except autocvi.IllConditionedError as err:
            assert "x64" in str(err)
            return
        assert not result.converged
        assert caught, "converged=False must come with a FitWarning saying why"
        return
    ref = reference(name)
    result, _ = fit_quietly(model, data)
    z_bar, sd_bar, exclude, _ = OUT_OF_REACH.get(name, (0.1, (0.9, 1.1), (), ""))
    draws = result.sample(jax.random.PRNGKey(0), 4000)
    z, ratio = scores(name, draws, ref, exclude=exclude, only_missing=data.get("mask"))
    svi = ref.get("svi") or {}
    svi_elbo = svi.get("elbo_best", svi.get("elbo"))
    summary = (
        f"{name}: converged={result.converged} ELBO {result.elbo_final:.2f} (SVI {svi_elbo}) "
        f"max|z| {z.max():.3f} median sd ratio {np.median(ratio):.2f}"
    )
    print(summary)
    assert result.converged, summary
    if svi_elbo is not None:
        slack = ELBO_SHORT.get(name, (0.5,))[0]
        assert result.elbo_final >= svi_elbo - slack, summary
    if z_bar is not None:
        assert z.max() <= z_bar, summary
    if sd_bar is not None:
        assert sd_bar[0] <= np.median(ratio) <= sd_bar[1], summary


def test_every_zoo_model_has_a_category_and_out_of_reach_says_why():
    from zoo.models import CATEGORY

    assert set(CATEGORY) >= set(MODELS)
    assert all(has_reference(n) for n in ZOO)
    for name, entry in OUT_OF_REACH.items():
        assert name in MODELS and entry[-1], name
    for name, (_, why) in ELBO_SHORT.items():
        assert name in OUT_OF_REACH and why, name
    for name, why in LOUD.items():
        assert name in MODELS and why, name
