"""The one place that decides floating-point precision for the tests.

JAX's default (what users get) is float32. A test module or test that compares
with a closed form to tight tolerances asks for float64 with the marker
``float64`` (``pytestmark = pytest.mark.float64``); every other test runs in
float32. The flag is set before the test's fixtures are built and restored
after, so the order in which modules are collected does not matter. A module
whose ``pytestmark`` asks for float64 is also *imported* (collected) in
float64, so arrays built at module level (parametrize cases) have the
precision its tests run in. Module- or session-scoped fixtures are built in the
precision of the first test that asks for them: keep them inside one module.
"""

import jax
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "float64: run this test with jax_enable_x64 on")


def _module_wants_float64(path) -> bool:
    for line in path.read_text().splitlines():
        if line.startswith("pytestmark") and "float64" in line:
            return True
    return False


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    if isinstance(collector, pytest.Module) and _module_wants_float64(collector.path):
        previous = jax.config.jax_enable_x64
        jax.config.update("jax_enable_x64", True)
        yield
        jax.config.update("jax_enable_x64", previous)
    else:
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    jax.config.update("jax_enable_x64", item.get_closest_marker("float64") is not None)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    if nextitem is not None:
        jax.config.update("jax_enable_x64", nextitem.get_closest_marker("float64") is not None)


@pytest.fixture
def precision():
    """The dtype the current test runs in (``jnp.float32`` or ``jnp.float64``)."""
    import jax.numpy as jnp

    return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
