"""Compile once per program structure: data become inputs, not constants.

``jax.jit`` caches a compiled program per Python function object, and bakes
every array the function closes over into the program as a constant. autocvi
builds new closures for every ``fit`` (the factors' log densities close over
the model's data), so a refit of the same model recompiled everything, and a
program with the data inside cannot be shared with a refit on new data.

:func:`structural_jit` traces the function to a jaxpr, lifts the captured
arrays out as arguments, and keys the compiled program on the jaxpr's text
(primitives, shapes, dtypes, parameters) and the shapes and dtypes of those
arrays. A second function that traces to the same jaxpr (the same model and
options, data of the same shapes and dtypes, any values, any seed) reuses the
executable; only the tracing is repeated. With data out of the program, JAX's
persistent compilation cache (``jax_compilation_cache_dir``) can also share it
between processes.

What changes the key (and compiles anew): the model's code, the options that
change the plan, data shapes or dtypes, the floating-point precision
(``jax_enable_x64``), and Python scalars in the model (they are literals of the
jaxpr). A value JAX keeps inside a sub-jaxpr's constants (rare: custom
derivative bodies) is fingerprinted by value, so it can only cause a miss,
never a stale program.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import numpy as np
from jax.extend import core as jcore

from . import flat_draws

__all__ = [
    "structural_jit",
    "clear_program_cache",
    "enable_compilation_cache",
    "program_cache_info",
]

# Compiled programs by structure, the loop's and the run-once ones apart (keyed by
# ``runs_once``); least recently used dropped beyond these many. A loop program holds
# large executables (tens of MB for a large model); a fit compiles a few run-once
# programs per site (its start draws), which must not push the loop out before a refit.
_MAX_PROGRAMS = {False: 16, True: 64}
_PROGRAMS: dict[bool, OrderedDict] = {False: OrderedDict(), True: OrderedDict()}
_STATS = {"hits": 0, "misses": 0}


# XLA options of a program a fit runs once or a few times (planning, the start, the final
# ELBO, the posterior): its compilation is most of its cost. LLVM's optimisation level 0
# and XLA's older loop emitters (no fusion emitters) cut it to a third (eight schools'
# CVI step 6.3 -> 2.0 s, its final-ELBO program 1.42 -> 0.70 s) while the code runs 2-3x
# slower. The loop's programs start here too and move to the default options once they
# have run long enough to pay for that compilation (:class:`_TieredProgram`).
RUNS_ONCE_OPTIONS = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}

# A loop program is compiled again at XLA's default optimisation once it has run for this
# many times the seconds its fast compilation took. The default compilation takes about
# three times as long and the code then runs 2-3x faster, so this is the ski-rental rule
# (rent until the rent paid would have bought): never more than about twice the better
# of the two choices made in hindsight.
TIER_UP_AFTER = 2.0

# A loop program that reads and writes more bytes than this per call (XLA's cost analysis
# of the program before compilation) is compiled at full optimisation at once: one call of
# the fast code would cost more than the compilation saves. The optimised code moved about
# 1 GB/s on this project's 2-core CPU (eight schools' 20-iteration chunk: 4.9 MB, 4 ms;
# stochastic volatility's: 3.7 GB, 3.3 s, and 16.5 s at the fast options, whose
# compilation saved 6 s), so the limit is a call of about 0.2 s.
FAST_TIER_MAX_BYTES = 2e8


def structural_jit(fn: Callable | None = None, *, runs_once: bool = False) -> Callable:
    """``jax.jit(fn)`` whose compiled program is shared by functions with the same jaxpr.

    Arguments are pytrees of arrays. The returned function retraces ``fn`` only
    for new argument shapes and dtypes (as ``jax.jit`` does); the XLA program is
    looked up by structure first (see the module docstring). ``runs_once``: the
    program is compiled for a short compilation (:data:`RUNS_ONCE_OPTIONS`), for
    code that runs once per fit; ``@structural_jit(runs_once=True)`` as a decorator.
    Otherwise (a loop's program) it starts with that short compilation and is compiled
    at full optimisation once it has run long enough (:class:`_TieredProgram`).
    """
    if fn is None:
        return lambda f: structural_jit(f, runs_once=runs_once)
    traced: dict = {}

    def call(*args):
        leaves, in_tree = jax.tree_util.tree_flatten(args)
        signature = (in_tree, tuple(_aval_key(x) for x in leaves))
        entry = traced.get(signature)
        if entry is None:
            closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
            consts = list(closed.consts)
            key = (
                runs_once,
                signature,
                str(closed.jaxpr),
                tuple(_aval_key(c) for c in consts),
                _nested_constants(closed.jaxpr),
            )
            entry = (
                _program(key, closed.jaxpr),
                consts,
                jax.tree_util.tree_structure(out_shape),
            )
            traced[signature] = entry
        program, consts, out_tree = entry
        return jax.tree_util.tree_unflatten(out_tree, program(consts, leaves))

    call.__wrapped__ = fn
    return call


def clear_program_cache() -> None:
    """Forget every compiled program (the next fit of each model compiles again), reset counts."""
    for programs in _PROGRAMS.values():
        programs.clear()
    _STATS.update(hits=0, misses=0)


def program_cache_info() -> dict:
    """``{"hits", "misses", "size", "optimised", "fast"}`` of the compiled-program cache,
    for diagnostics, tests and benchmarks: ``optimised``, the loop programs that have moved
    to XLA's default optimisation (:class:`_TieredProgram`); ``fast``, the loop programs
    compiled and still at the short compilation's code."""
    tiers = [p.tier for p in _PROGRAMS[False].values() if p.compiled]
    return {
        **_STATS,
        "size": sum(len(p) for p in _PROGRAMS.values()),
        "optimised": tiers.count("optimised"),
        "fast": tiers.count("fast"),
    }


def enable_compilation_cache(path=None, min_compile_time_secs: float = 0.0) -> str:
    """Keep compiled programs on disk, so a new Python process does not compile again.

    Sets JAX's persistent compilation cache (``jax_compilation_cache_dir``), a
    process-wide JAX setting, which is why autocvi never sets it by itself. Because
    :func:`structural_jit` keeps the data out of the programs, the second run of a
    script (any data of the same shapes) loads them instead of compiling; the small
    programs of tracing and planning are kept too (``min_compile_time_secs=0``).
    Measured on a 14-site conjugate hierarchy, pinned to one core: a first ``fit`` in
    a new process 13.7 s without, 2.4 s with a warm cache. JAX's C++ runtime may log
    "Assume version compatibility" once per program loaded (set the environment
    variable ``TF_CPP_MIN_LOG_LEVEL=1`` before importing jax to silence it).

    Args:
        path: the cache directory (default ``~/.cache/autocvi/jax``).
        min_compile_time_secs: only programs that took longer to compile are kept.

    Returns:
        the directory used.
    """
    path = os.path.expanduser(path or os.path.join("~", ".cache", "autocvi", "jax"))
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def _program(key, jaxpr) -> Callable:
    programs = _PROGRAMS[key[0]]  # key[0]: runs_once
    program = programs.get(key)
    if program is not None:
        _STATS["hits"] += 1
        programs.move_to_end(key)
        return program
    _STATS["misses"] += 1

    def evaluate(consts, leaves):
        return flat_draws.evaluate(jaxpr, consts, leaves)

    if key[0]:
        program = jax.jit(evaluate, compiler_options=_supported(RUNS_ONCE_OPTIONS))
    else:
        program = _TieredProgram(evaluate)
    programs[key] = program
    while len(programs) > _MAX_PROGRAMS[key[0]]:
        programs.popitem(last=False)
    return program


class _TieredProgram:
    """A loop's program: compiled first with :data:`RUNS_ONCE_OPTIONS` (a third of the
    compilation, code 2-3x slower), and at XLA's default optimisation once its runs have
    taken :data:`TIER_UP_AFTER` times that compilation's seconds. With more than one core
    the second compilation runs in a background thread while the first program goes on
    running; on one core it runs before the next call. Kept in the program cache, so a
    refit goes on from where the last fit left it (the optimised program, once built).

    Until it tiers up, a call waits for its results (to time them): the callers read
    every chunk's ELBOs at once anyway.
    """

    def __init__(self, evaluate: Callable):
        self._jitted = jax.jit(evaluate)
        self._lowered = None  # kept from the fast compilation for the optimised one
        self._fast = None
        self._optimised = None
        self._pending = None
        self._compile_seconds = 0.0
        self._ran_seconds = 0.0

    def __call__(self, consts, leaves):
        if any(isinstance(x, jax.core.Tracer) for x in (*consts, *leaves)):
            return self._jitted(consts, leaves)  # inside a caller's jit or vmap: inlined
        if self._optimised is None and self._pending is not None and self._pending.done():
            # a failed optimised compilation leaves the fast program running
            self._optimised = None if self._pending.exception() else self._pending.result()
        if self._optimised is not None:
            return self._optimised(consts, leaves)
        if self._fast is None:
            start = time.perf_counter()
            lowered = self._jitted.lower(consts, leaves)
            if _bytes_accessed(lowered) > FAST_TIER_MAX_BYTES:
                self._optimised = _compile(lowered, None)
                return self._optimised(consts, leaves)
            self._fast = _compile(lowered, RUNS_ONCE_OPTIONS)
            self._compile_seconds = time.perf_counter() - start
            self._lowered = lowered
        start = time.perf_counter()
        out = jax.block_until_ready(self._fast(consts, leaves))
        self._ran_seconds += time.perf_counter() - start
        if self._pending is None and self._ran_seconds >= TIER_UP_AFTER * self._compile_seconds:
            lowered, self._lowered = self._lowered, None
            self._pending = (_background() if _cores() > 1 else _Now()).submit(
                _compile, lowered, None
            )
        return out

    @property
    def compiled(self) -> bool:
        """Whether a call has compiled it yet (a program looked up but not yet called has not)."""
        return self._fast is not None or self._optimised is not None

    @property
    def tier(self) -> str:
        """``"fast"`` until the optimised program is in use, then ``"optimised"``."""
        return "fast" if self._optimised is None else "optimised"


def _bytes_accessed(lowered) -> float:
    """XLA's estimate of the bytes one call reads and writes (0 when it has none)."""
    try:
        cost = lowered.cost_analysis() or {}
        if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
            cost = cost[0] if cost else {}
        return float(cost.get("bytes accessed", 0.0))
    except Exception:  # noqa: BLE001 - an estimate only: without it, the fast tier first
        return 0.0


def _compile(lowered, options):
    """``lowered.compile(options)``, the options this XLA accepts (they are XLA debug
    options, renamed or removed between releases: a missing one costs speed, not a fit)."""
    return lowered.compile(_supported(options)) if options else lowered.compile()


_SUPPORTED: dict[str, bool] = {}


def _supported(options: dict | None) -> dict | None:
    """The entries of ``options`` this XLA's CPU compiler knows (tried once each)."""
    if not options:
        return options
    known = {}
    for name, value in options.items():
        if name not in _SUPPORTED:
            try:
                jax.jit(lambda x: x + 1).lower(np.float32(0)).compile({name: value})
                _SUPPORTED[name] = True
            except Exception:  # noqa: BLE001 - XLA raises a plain runtime error
                _SUPPORTED[name] = False
        if _SUPPORTED[name]:
            known[name] = value
    return known


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class _Now:
    """An executor that runs the job at once, in this thread (one core: nothing to gain
    from a thread), with the same ``submit -> Future`` interface."""

    @staticmethod
    def submit(fn, *args) -> Future:
        future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as err:  # noqa: BLE001 - kept in the future, as a thread would
            future.set_exception(err)
        return future


_EXECUTOR = []


def _background():
    """One background thread for the optimised compilations (XLA releases the GIL)."""
    if not _EXECUTOR:
        _EXECUTOR.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="autocvi-xla"))
    return _EXECUTOR[0]


def _aval_key(x) -> str:
    """Shape, dtype and weak type, as ``jax.jit`` distinguishes arguments."""
    return str(jax.typeof(x))


def _nested_constants(jaxpr) -> tuple:
    """Fingerprints (by value) of constants held inside sub-jaxprs' parameters."""
    found = []

    def visit(j):
        for eqn in j.eqns:
            for p in eqn.params.values():
                for sub in p if isinstance(p, (tuple, list)) else (p,):
                    if isinstance(sub, jcore.ClosedJaxpr):
                        found.extend(_fingerprint(c) for c in sub.consts)
                        visit(sub.jaxpr)
                    elif isinstance(sub, jcore.Jaxpr):
                        visit(sub)

    visit(jaxpr)
    return tuple(found)


def _fingerprint(c) -> tuple:
    a = np.asarray(c)
    return (a.shape, str(a.dtype), hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest())
