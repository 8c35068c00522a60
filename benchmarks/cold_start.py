"""Time to first answer (issue 14): ``python -m benchmarks cold_start [--quick]``.

The measurements are the zoo's (:mod:`benchmarks.zoo`): each model in a fresh process,
autocvi's cold fit (trace, plan, compilation, loop), its warm refit and the split of
both, against NumPyro SVI's compile seconds and its compiled loop's seconds to within
1 nat of the better optimum. One run writes both ``results/zoo.*`` and
``results/cold_start.*`` (the same processes: running them twice would double the
hour the zoo takes).
"""

from __future__ import annotations

from . import zoo


def main(argv=None):
    zoo.main(argv)
