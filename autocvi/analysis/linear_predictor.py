"""Split a factor's log density into an affine linear predictor and the rest.

For a Gaussian latent ``w`` and a non-conjugate factor whose per-element log
density depends on ``w`` only through a scalar predictor per element,
``eta_n = a_n^T w + b_n``, CVI computes the natural-gradient message by 1-D
Gauss-Hermite quadrature on ``eta`` (Khan & Lin 2017, App. B.1/E.1:
``dE/dm = E[l']``, ``dE/dv = E[l'']/2``).  This module finds that split
automatically::

    lp = find_linear_predictor(fn, values, target)   # LinearPredictor | None
    eta = lp.eta_fn(values)                          # affine in values[target]
    fn(values) == lp.rest_fn(eta, values)            # rest_fn ignores values[target]

Mechanism.  ``fn`` is traced to a jaxpr; ``jit``/``closed_call``/``remat``
sub-jaxprs are inlined into one flat graph of equations.  A forward pass
classifies every variable w.r.t. the target as CONST / AFFINE / OTHER.  Among
the AFFINE variables with exactly the output's shape, the one closest to the
output that *dominates* it (every dependency path from the target to the
output passes through it) becomes ``eta``.  The rest of the graph (the
equations the output needs once ``eta`` is given) must be elementwise in
``eta``: checked structurally (a whitelist of elementwise primitives, identity
reshapes, custom-derivative calls analysed inside) and, as a safety net,
numerically by Jacobian-vector products with one-hot tangents.  Anything not
proven is rejected: the function returns ``None`` rather than a wrong split.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Jaxpr

from ..jaxpr import CUSTOM_DERIVATIVE, PLAIN_CALLS, bind, call_body, interpret, structural_jit

__all__ = ["LinearPredictor", "find_linear_predictor", "find_vector_predictor"]


class LinearPredictor(NamedTuple):
    """``fn(values) == rest_fn(eta_fn(values), values)``.

    ``eta_fn(values)`` has the factor's output shape and is affine in
    ``values[target]``; ``rest_fn(eta, values)`` never reads
    ``values[target]`` (the key may even be absent) and each output element
    depends only on the same element of ``eta``.  Both are pure JAX functions
    (jit/vmap/grad compatible) for values of the traced shapes; map over extra
    leading axes (e.g. quadrature nodes) with ``jax.vmap``.
    """

    eta_fn: Callable[[dict], Any]
    rest_fn: Callable[[Any, dict], Any]
    # Set when ``rest_fn`` is itself a Gaussian expectation,
    # ``rest_fn(eta, v) = E_{e ~ N(0, 1)}[point_fn(eta + s e, v)]`` with
    # ``s**2 = residual_var_fn(v)`` per element (an integrated conditional's
    # residual: autocvi.analysis.integrate). Then
    # ``E_{eta ~ N(m, v)}[rest_fn(eta)] = E_{eta ~ N(m, v + s^2)}[point_fn(eta)]``: one
    # 1-D rule instead of an outer rule over an inner one.
    point_fn: Callable[[Any, dict], Any] | None = None
    residual_var_fn: Callable[[dict], Any] | None = None
    # None: one scalar predictor per output element (the Gauss-Hermite split). K: a
    # *vector* predictor, ``eta_fn(values)`` of shape ``out.shape + (K,)`` and output
    # element ``i`` depending on the row ``eta[i, :]`` only (a softmax's logits per
    # observation: find_vector_predictor); its messages use a K-dim cubature rule.
    vector_size: int | None = None

    def point_rest(self, values: dict) -> tuple[Callable, Any]:
        """``(l, r)`` with ``E_{eta ~ N(m, v)}[rest_fn(eta, values)] =
        E_{eta ~ N(m, v + r)}[l(eta)]`` per element: ``(point_fn, s^2)`` for a
        predictor with a Gaussian residual, else ``(rest_fn, 0)``."""
        if self.point_fn is None:
            return (lambda eta: self.rest_fn(eta, values)), 0.0
        return (lambda eta: self.point_fn(eta, values)), self.residual_var_fn(values)


# --------------------------------------------------------------------------
# Flat graph: jaxpr with call-like sub-jaxprs inlined
# --------------------------------------------------------------------------


class _Lit(NamedTuple):
    val: Any
    aval: Any


class _Eqn(NamedTuple):
    prim: Any
    params: dict
    ins: tuple  # node ids (int) or _Lit
    outs: tuple  # node ids; -1 for dropped outputs
    source: Any  # the jaxpr equation this one copies (its sub-jaxprs, source info)


class _Graph:
    """Equations over integer node ids, in topological order."""

    def __init__(self):
        self.avals: list = []
        self.eqns: list[_Eqn] = []
        self.consts: dict[int, Any] = {}
        self.inputs: list[int] = []
        self.outputs: list = []  # node ids or _Lit

    def new(self, aval) -> int:
        self.avals.append(aval)
        return len(self.avals) - 1


def _flatten_into(g: _Graph, jaxpr: Jaxpr, consts, in_refs) -> list:
    """Append ``jaxpr``'s equations to ``g`` with plain calls inlined; its outputs."""

    def const(var, value) -> int:
        i = g.new(var.aval)
        g.consts[i] = value
        return i

    def append(eqn, ins) -> list[int]:
        outs = [g.new(v.aval) for v in eqn.outvars]
        g.eqns.append(_Eqn(eqn.primitive, dict(eqn.params), tuple(ins), tuple(outs), eqn))
        return outs

    return interpret(
        jaxpr,
        consts,
        in_refs,
        append,
        literal=lambda lit: _Lit(lit.val, lit.aval),
        const=const,
        enter=PLAIN_CALLS,
    )


def _flatten(jaxpr: Jaxpr, consts) -> _Graph:
    g = _Graph()
    g.inputs = [g.new(v.aval) for v in jaxpr.invars]
    g.outputs = _flatten_into(g, jaxpr, consts, g.inputs)
    return g


def _eval(g: _Graph, plan: list[int], env: dict, targets: list) -> list:
    """Run the equations ``plan`` (indices into ``g.eqns``) on ``env``."""

    def read(r):
        return r.val if isinstance(r, _Lit) else env[r]

    for k in plan:
        e = g.eqns[k]
        ans = bind(e.source, [read(r) for r in e.ins])
        for i, a in zip(e.outs, ans):
            env[i] = a
    return [read(r) for r in targets]


def _live(g: _Graph, targets: list, stop: frozenset = frozenset()) -> list[int]:
    """Equations needed for ``targets``, treating nodes in ``stop`` as given."""
    need = {r for r in targets if isinstance(r, int) and r not in stop}
    plan = []
    for k in range(len(g.eqns) - 1, -1, -1):
        e = g.eqns[k]
        if any(o in need for o in e.outs):
            plan.append(k)
            for r in e.ins:
                if isinstance(r, int) and r not in stop:
                    need.add(r)
    plan.reverse()
    return plan


# --------------------------------------------------------------------------
# Affine analysis w.r.t. the target
# --------------------------------------------------------------------------

CONST, AFFINE, OTHER = 0, 1, 2

# Linear structural primitives: output AFFINE if every operand is AFFINE/CONST.
_LINEAR_ALL = frozenset(
    {
        "add",
        "add_any",
        "sub",
        "neg",
        "reduce_sum",
        "broadcast_in_dim",
        "reshape",
        "squeeze",
        "expand_dims",
        "transpose",
        "slice",
        "rev",
        "copy",
        "copy_p",
        "concatenate",
        "pad",
        "cumsum",
        "split",
    }
)


def _is_float(aval) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.inexact)


def _affine_rule(e: _Eqn, cls: list[int], g: _Graph) -> list[int]:
    name = e.prim.name
    n_out = len(e.outs)
    if all(c == CONST for c in cls):
        return [CONST] * n_out
    if any(c == OTHER for c in cls):
        return [OTHER] * n_out
    # Some operand AFFINE, none OTHER.
    ok = False
    if name in _LINEAR_ALL:
        ok = True
        if name in ("reshape", "broadcast_in_dim"):  # dynamic-shape operands
            ok = all(c == CONST for c in cls[1:])
    elif name == "mul":
        ok = cls.count(AFFINE) == 1
    elif name == "div":
        ok = cls[1] == CONST
    elif name == "dot_general":
        ok = cls.count(AFFINE) == 1
    elif name == "convert_element_type":
        ok = _is_float(_aval_of(g, e.ins[0]))
    elif name == "select_n":
        ok = cls[0] == CONST
    elif name in ("dynamic_slice", "gather"):
        ok = all(c == CONST for c in cls[1:])
    elif name == "dynamic_update_slice":
        ok = all(c == CONST for c in cls[2:])
    elif name in ("scatter-add", "scatter_add", "scatter"):
        ok = cls[1] == CONST
    elif name == "triangular_solve":
        ok = cls[0] == CONST
    if ok and all(_is_float(g.avals[o]) for o in e.outs if o >= 0):
        return [AFFINE] * n_out
    return [OTHER] * n_out


def _aval_of(g: _Graph, r):
    return r.aval if isinstance(r, _Lit) else g.avals[r]


def _classify(g: _Graph, in_cls: dict[int, int], rule) -> list[int]:
    """Forward pass; nodes not in ``in_cls`` (consts, literals) are CONST."""
    cls = [CONST] * len(g.avals)
    for i, c in in_cls.items():
        cls[i] = c
    for e in g.eqns:
        ic = [CONST if isinstance(r, _Lit) else cls[r] for r in e.ins]
        for o, c in zip(e.outs, rule(e, ic, g)):
            if o >= 0:
                cls[o] = c
    return cls


def _custom_rule(e: _Eqn, cls: list[int], rule, **kw) -> list[int] | None:
    """Analyse a custom-derivative call through its primal body."""
    body = call_body(e.source) if e.prim.name in CUSTOM_DERIVATIVE else None
    if body is None:
        return None
    sg = _flatten(*body)
    sub_cls = _classify(sg, dict(zip(sg.inputs, cls)), lambda ee, c, gg: rule(ee, c, gg, **kw))
    return [CONST if isinstance(r, _Lit) else sub_cls[r] for r in sg.outputs]


def _affine_rule_rec(e, cls, g):
    if e.prim.name in CUSTOM_DERIVATIVE and any(c != CONST for c in cls):
        out = _custom_rule(e, cls, _affine_rule_rec)
        if out is not None:
            return out
    return _affine_rule(e, cls, g)


# --------------------------------------------------------------------------
# Elementwise analysis of the rest w.r.t. eta
# --------------------------------------------------------------------------

DIAG = AFFINE  # "element i depends only on eta[i]"

_ELEMENTWISE = frozenset(
    """abs acos acosh add add_any and asin asinh atan atan2 atanh bessel_i0e bessel_i1e
    cbrt ceil clamp conj convert_element_type copy copy_p cos cosh digamma div eq erf
    erf_inv erfc exp exp2 expm1 floor ge gt igamma igamma_grad_a igammac imag
    integer_pow is_finite le lgamma log log1p logistic lt max min mul ne neg nextafter
    not or polygamma pow random_gamma_grad real reduce_precision
    regularized_incomplete_beta rem round rsqrt select_n sign sin sinh sqrt square sub
    tan tanh xor zeta complex""".split()
)


def _ends_with(sh, shape) -> bool:
    sh, shape = tuple(sh), tuple(shape)
    return len(sh) >= len(shape) and sh[len(sh) - len(shape) :] == shape


def _settled(e: _Eqn, cls: list[int], rule, shape) -> list[int] | None:
    """The classes every elementwise analysis gives alike, or None: constant inputs give
    constants, an input already OTHER gives OTHER, and a custom-derivative call is
    analysed inside its body by the same ``rule``."""
    n_out = len(e.outs)
    if all(c == CONST for c in cls):
        return [CONST] * n_out
    if any(c == OTHER for c in cls):
        return [OTHER] * n_out
    if e.prim.name in CUSTOM_DERIVATIVE:
        out = _custom_rule(e, cls, rule, shape=shape)
        return out if out is not None else [OTHER] * n_out
    return None


def _diag_rule(e: _Eqn, cls: list[int], g: _Graph, shape=()) -> list[int]:
    """DIAG: the value's shape is ``lead + shape`` and its element ``[l, i]`` depends on
    ``eta[i]`` only. Leading axes let a quadrature rule inside the factor (the nodes of
    an integrated conditional, :mod:`autocvi.analysis.integrate`) be a new leading axis
    that is summed out again."""
    name = e.prim.name
    n_out = len(e.outs)
    settled = _settled(e, cls, _diag_rule, shape)
    if settled is not None:
        return settled
    in_shapes = [tuple(_aval_of(g, r).shape) for r, c in zip(e.ins, cls) if c == DIAG]
    diag_shapes_ok = all(_ends_with(sh, shape) for sh in in_shapes) and all(
        _ends_with(g.avals[o].shape, shape) for o in e.outs if o >= 0
    )
    if not diag_shapes_ok or n_out != 1:
        return [OTHER] * n_out
    p = e.params
    nd = len(shape)
    out_rank = len(g.avals[e.outs[0]].shape)
    lead = out_rank - nd  # leading (quadrature) axes of the output
    ok = name in _ELEMENTWISE and all(len(sh) == out_rank for sh in in_shapes)
    if name == "broadcast_in_dim":
        dims = tuple(p["broadcast_dimensions"])
        ok = (
            len(dims) >= nd
            and dims[len(dims) - nd :] == tuple(range(lead, out_rank))
            and all(c == CONST for c in cls[1:])
        )
    elif name == "reshape":
        ok = (
            p.get("dimensions") is None
            and all(c == CONST for c in cls[1:])
            and _ends_with(in_shapes[0], shape)
        )
    elif name == "squeeze":
        ok = all(
            d % (out_rank + len(p["dimensions"])) < len(in_shapes[0]) - nd for d in p["dimensions"]
        )
    elif name == "transpose":
        perm = tuple(p["permutation"])
        ok = perm[len(perm) - nd :] == tuple(range(len(perm) - nd, len(perm)))
    elif name in ("reduce_sum", "reduce_max", "reduce_min"):
        ok = all(a < len(in_shapes[0]) - nd for a in p["axes"])
    return [DIAG if ok else OTHER]


# Row-wise analysis of the rest w.r.t. a vector predictor: ROW means "the value's shape
# starts with the output's shape and its element ``[i, ...]`` depends only on the row
# ``eta[i, :]``". A softmax likelihood's log density reduces each row of logits
# (logsumexp), then picks the observed class out of it (take_along_axis, a gather whose
# batching dimensions are the leading axes): both keep rows apart.
ROW = AFFINE

_ROW_REDUCTIONS = frozenset(
    {
        "reduce_sum",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "reduce_and",
        "reduce_or",
        "argmax",
        "argmin",
    }
)


def _row_rule(e: _Eqn, cls: list[int], g: _Graph, shape=()) -> list[int]:
    name = e.prim.name
    n_out = len(e.outs)
    settled = _settled(e, cls, _row_rule, shape)
    if settled is not None:
        return settled
    nd = len(shape)
    in_shapes = [tuple(_aval_of(g, r).shape) for r, c in zip(e.ins, cls) if c == ROW]
    if n_out != 1 or e.outs[0] < 0:
        return [OTHER] * n_out
    out_shape = tuple(g.avals[e.outs[0]].shape)
    if tuple(out_shape[:nd]) != tuple(shape) or any(sh[:nd] != tuple(shape) for sh in in_shapes):
        return [OTHER]
    p = e.params
    row_first = cls[0] == ROW and all(c == CONST for c in cls[1:])
    ok = False
    if name in _ELEMENTWISE or name == "stop_gradient":
        # size-1 axes broadcast (lax does so implicitly); the row axes are equal (above)
        ok = all(
            len(sh) == len(out_shape) and all(a in (b, 1) for a, b in zip(sh, out_shape))
            for sh in in_shapes
        )
    elif name in _ROW_REDUCTIONS:
        ok = all(a >= nd for a in p["axes"])
    elif name == "broadcast_in_dim":
        dims = tuple(p["broadcast_dimensions"])
        ok = row_first and dims[:nd] == tuple(range(nd))
    elif name == "reshape":  # row-major order keeps each row's block when the prefix stays
        ok = row_first and p.get("dimensions") is None
    elif name in ("squeeze", "expand_dims"):
        ok = all(d >= nd for d in p["dimensions"])
    elif name == "transpose":
        ok = tuple(p["permutation"])[:nd] == tuple(range(nd))
    elif name == "concatenate":
        ok = p["dimension"] >= nd
    elif name in ("slice", "rev", "cumsum", "cumlogsumexp", "cummax", "cummin"):
        if name == "slice":
            ok = tuple(p["start_indices"][:nd]) == (0,) * nd and (
                p["strides"] is None or tuple(p["strides"][:nd]) == (1,) * nd
            )
        elif name == "rev":
            ok = all(d >= nd for d in p["dimensions"])
        else:
            ok = p["axis"] >= nd
    elif name == "gather":  # take_along_axis over the last axis: the rows are batch axes
        dn = p["dimension_numbers"]
        ok = (
            row_first
            and tuple(dn.operand_batching_dims) == tuple(range(nd))
            and tuple(dn.start_indices_batching_dims) == tuple(range(nd))
            and all(d >= nd for d in dn.offset_dims)
            and all(d >= nd for d in dn.start_index_map)
        )
    elif name == "dot_general":  # rows times a constant matrix, contracted over the row
        (lc, _rc), (lb, rb) = p["dimension_numbers"]
        ok = (
            row_first
            and all(d >= nd for d in lc)
            and tuple(lb) in ((), tuple(range(nd)))
            and len(lb) == len(rb)
        )
    return [ROW if ok else OTHER]


# --------------------------------------------------------------------------
# Dominators
# --------------------------------------------------------------------------


def _taints_output(g: _Graph, source: int, clean: int | None, out: int) -> bool:
    """Does a dependency path from ``source`` reach ``out`` avoiding ``clean``?"""
    if source == clean:
        return False
    tainted = {source}
    for e in g.eqns:
        if any(isinstance(r, int) and r in tainted for r in e.ins):
            for o in e.outs:
                if o >= 0 and o != clean:
                    tainted.add(o)
    return out in tainted


# --------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _signature(values, target):
    leaves, treedef = jax.tree_util.tree_flatten(values)
    return (
        treedef,
        tuple((tuple(jnp.shape(x)), jnp.result_type(x).name) for x in leaves),
        target,
    )


def find_linear_predictor(
    fn: Callable[[dict], Any], values: dict, target: str
) -> LinearPredictor | None:
    """Split ``fn`` into an affine predictor of ``values[target]`` and the rest.

    Returns ``None`` unless ``fn(values)`` (one array) depends on
    ``values[target]`` only through one intermediate ``eta`` that is affine in
    the target, has exactly the output's shape, and each output element
    depends only on the same element of ``eta``.  Also ``None`` if the output
    does not depend on the target at all.  Results are cached per ``fn``
    object and value shapes/dtypes.
    """
    return _cached(fn, values, target, vector=False)


def find_vector_predictor(
    fn: Callable[[dict], Any], values: dict, target: str
) -> LinearPredictor | None:
    """Split ``fn`` into an affine *vector* predictor of ``values[target]`` and the rest.

    Like :func:`find_linear_predictor`, but ``eta`` has the output's shape plus one
    trailing axis of size K >= 2 and each output element depends only on its own row
    ``eta[i, :]`` (a categorical likelihood's logits ``X @ W``, one K-vector per
    observation; ``vector_size = K``). ``None`` where rows mix (a normalisation over
    observations) or no such ``eta`` dominates the output. The row-wise rest is proven
    structurally (:func:`_row_rule`) and checked by JVPs with tangents on one row.
    """
    return _cached(fn, values, target, vector=True)


def _cached(fn, values, target, vector: bool) -> LinearPredictor | None:
    if target not in values:
        raise KeyError(f"target {target!r} is not a key of values")
    sig = (_signature(values, target), vector)
    try:
        per_fn = _CACHE.get(fn)
    except TypeError:  # not weak-referenceable / hashable
        per_fn = None
    if per_fn is not None and sig in per_fn:
        return per_fn[sig]
    result, cacheable = _find(fn, values, target, vector)
    if cacheable:
        try:
            _CACHE.setdefault(fn, {})[sig] = result
        except TypeError:
            pass
    return result


def _find(fn, values, target, vector=False) -> tuple[LinearPredictor | None, bool]:
    leaves, treedef = jax.tree_util.tree_flatten(values)
    keyed = jax.tree_util.tree_flatten_with_path(values)[0]
    t_idx = [
        k for k, (path, _) in enumerate(keyed) if path and getattr(path[0], "key", None) == target
    ]
    if len(t_idx) != 1:
        return None, True  # target is not a single array
    t_idx = t_idx[0]

    def flat_fn(*xs):
        return fn(jax.tree_util.tree_unflatten(treedef, xs))

    closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*leaves)
    g = _flatten(closed.jaxpr, closed.consts)
    # consts capturing an outer trace's tracers must not outlive that trace
    cacheable = not any(isinstance(c, jax.core.Tracer) for c in g.consts.values())
    if not isinstance(out_shape, jax.ShapeDtypeStruct):
        return None, cacheable  # not a single array output
    if len(g.outputs) != 1 or not isinstance(g.outputs[0], int):
        return None, cacheable
    out = g.outputs[0]
    shape = tuple(out_shape.shape)
    src = g.inputs[t_idx]
    if not _is_float(g.avals[src]) or not _taints_output(g, src, None, out):
        return None, cacheable

    cls = _classify(g, {src: AFFINE}, _affine_rule_rec)
    # Candidates, closest to the output first: outputs of later equations,
    # then the target input itself.
    cands = [o for e in reversed(g.eqns) for o in reversed(e.outs) if o >= 0]
    cands.append(src)
    in_avals = [g.avals[i] for i in g.inputs]
    # abstract values or consts (inside an outer trace): structural check only
    concrete = cacheable and not any(isinstance(x, jax.core.Tracer) for x in leaves)
    for v in cands:
        v_shape = tuple(g.avals[v].shape)
        if vector:  # out.shape + (K,), K >= 2 (K = 1 is the scalar split's case)
            fits = len(v_shape) == len(shape) + 1 and v_shape[:-1] == shape and v_shape[-1] >= 2
        else:
            fits = v_shape == shape
        if cls[v] != AFFINE or not fits or not _is_float(g.avals[v]):
            continue
        if _taints_output(g, src, v, out):
            continue
        lp = _build(
            g, v, out, src, t_idx, treedef, in_avals, values, target, shape, concrete, vector
        )
        if lp is not None:
            return lp, cacheable
    return None, cacheable


def _build(g, v, out, src, t_idx, treedef, in_avals, values, target, shape, concrete, vector):
    eta_plan = _live(g, [v])
    rest_plan = _live(g, [out], stop=frozenset({v}))
    rest_nodes = {o for k in rest_plan for o in g.eqns[k].outs} | {
        r for k in rest_plan for r in g.eqns[k].ins if isinstance(r, int)
    }
    if (src != v and src in rest_nodes) or v in {o for k in rest_plan for o in g.eqns[k].outs}:
        return None  # cannot happen for a dominator; be safe
    # Structural elementwise check of the rest w.r.t. eta.
    size = int(np.prod(shape, dtype=np.int64))
    rule = _row_rule if vector else _diag_rule
    if size > 1:
        sub = _Graph()
        sub.avals, sub.consts, sub.inputs = g.avals, g.consts, g.inputs
        sub.eqns = [g.eqns[k] for k in rest_plan]
        dcls = _classify(sub, {v: DIAG}, lambda e, c, gg: rule(e, c, gg, shape=shape))
        if out != v and dcls[out] == OTHER:
            return None
    eta_aval = g.avals[v]
    eta_shape = tuple(eta_aval.shape)
    n_leaves = len(in_avals)

    # Inputs the predictor or the rest actually read: a caller may leave out the
    # others (a latent that only the model's other sites depend on, e.g. the scale
    # of a random walk whose values are given by a joint group).
    read = {r for k in (*eta_plan, *rest_plan) for r in g.eqns[k].ins if isinstance(r, int)}
    leaf_of = jax.tree_util.tree_unflatten(treedef, list(range(n_leaves)))

    def flat_values(vals, allow_missing_target):
        missing = [k for k in leaf_of if k not in vals] if isinstance(leaf_of, dict) else []
        if missing:
            vals = dict(vals)
            for k in missing:
                i = leaf_of[k]
                if not isinstance(i, int) or (g.inputs[i] in read and k != target):
                    raise ValueError(
                        f"the linear predictor of {target!r} needs {k!r}, which was not given"
                    )
                if k == target and not allow_missing_target:
                    raise ValueError(f"the linear predictor of {target!r} needs its value")
                vals[k] = jnp.zeros(in_avals[i].shape, in_avals[i].dtype)
        leaves, td = jax.tree_util.tree_flatten(vals)
        if td != treedef or len(leaves) != n_leaves:
            raise ValueError(f"values structure {td} differs from the traced structure {treedef}")
        out_leaves = []
        for x, a in zip(leaves, in_avals):
            if tuple(jnp.shape(x)) != tuple(a.shape):
                raise ValueError(
                    f"value shape {jnp.shape(x)} differs from the traced shape {a.shape}; "
                    "use jax.vmap for extra leading axes"
                )
            out_leaves.append(jnp.asarray(x, dtype=a.dtype))
        return out_leaves

    def base_env(leaves):
        env = dict(g.consts)
        env.update(zip(g.inputs, leaves))
        return env

    def eta_fn(vals):
        env = base_env(flat_values(vals, False))
        return _eval(g, eta_plan, env, [v])[0]

    def rest_fn(eta, vals):
        leaves = flat_values(vals, True)
        env = base_env(leaves)
        env.pop(src, None)  # never read the target
        eta = jnp.asarray(eta, dtype=eta_aval.dtype)
        if tuple(eta.shape) != eta_shape:
            raise ValueError(
                f"eta shape {eta.shape} differs from {eta_shape}; use jax.vmap for extra axes"
            )
        env[v] = eta
        return _eval(g, rest_plan, env, [out])[0]

    if size > 1 and concrete and not _numeric_elementwise_ok(eta_fn, rest_fn, values, eta_shape):
        return None
    return LinearPredictor(eta_fn, rest_fn, vector_size=eta_shape[-1] if vector else None)


def _numeric_elementwise_ok(eta_fn, rest_fn, values, eta_shape) -> bool:
    """Safety net: JVPs of ``rest_fn`` in eta with tangents on one output element (a
    random direction in its row for a vector predictor) stay on that element."""
    rng = np.random.RandomState(0)
    eta_shape = tuple(eta_shape)
    probe = jax.eval_shape(eta_fn, values)
    out_shape = tuple(jax.eval_shape(lambda v: rest_fn(eta_fn(v), v), values).shape)
    del probe
    width = int(np.prod(eta_shape[len(out_shape) :], dtype=np.int64))  # 1, or K
    size = int(np.prod(out_shape, dtype=np.int64))
    pos = sorted({0, size - 1, *rng.randint(0, size, size=min(4, size)).tolist()})
    tangents = np.zeros((len(pos), size, width))
    tangents[np.arange(len(pos)), pos] = rng.randn(len(pos), width) if width > 1 else 1.0
    tangents = tangents.reshape((len(pos), *eta_shape))
    mask = np.ones((len(pos), size), bool)
    mask[np.arange(len(pos)), pos] = False
    mask = mask.reshape((len(pos), *out_shape))
    noise = rng.randn(*eta_shape)

    # structural_jit, not jax.jit: a new closure per plan would recompile on every refit
    @structural_jit(runs_once=True)
    def coupled(vals):
        eta0 = eta_fn(vals)
        t = jnp.asarray(tangents, dtype=eta0.dtype)
        bad = jnp.zeros((), bool)
        for eta in (eta0, eta0 + 0.5 * jnp.asarray(noise, dtype=eta0.dtype)):

            def jvp(t1, eta=eta):
                return jax.jvp(lambda e: rest_fn(e, vals), (eta,), (t1,))[1]

            off = jnp.where(jnp.asarray(mask), jax.vmap(jvp)(t), 0.0)
            bad = bad | jnp.any(jnp.isfinite(off) & (off != 0))
        return bad

    return not bool(coupled(values))
