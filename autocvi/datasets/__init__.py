"""Small data sets bundled with autocvi (the papers' experiments; see README.md here).

>>> d = autocvi.datasets.load("ionosphere")
>>> d["X"].shape
(280, 34)

Nothing is downloaded: the files are part of the package.
"""

from __future__ import annotations

from importlib import resources

import numpy as np

__all__ = ["load", "names"]


def names() -> tuple[str, ...]:
    """The names of the bundled data sets."""
    folder = resources.files(__name__) / "data"
    return tuple(
        sorted(p.name.removesuffix(".npz") for p in folder.iterdir() if p.name.endswith(".npz"))
    )


def load(name: str) -> dict[str, np.ndarray]:
    """The arrays of a bundled data set as a dict of NumPy arrays.

    Args:
        name: one of :func:`names` (e.g. ``"ionosphere"``, ``"breast_cancer_scale"``).

    Raises:
        KeyError: for an unknown name (the message lists the known ones).
    """
    path = resources.files(__name__) / "data" / f"{name}.npz"
    if not path.is_file():
        raise KeyError(f"no bundled data set {name!r}; the bundled ones are {', '.join(names())}")
    with resources.as_file(path) as p, np.load(p, allow_pickle=False) as archive:
        return {k: np.asarray(archive[k]) for k in archive.files}
