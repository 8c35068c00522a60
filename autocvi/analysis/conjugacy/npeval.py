"""numpy implementations of common lax primitives.

The interpreter evaluates many small equations on concrete arrays (constants,
guards at a few draws of the target, coefficient arrays).  Binding each lax
primitive eagerly compiles one XLA executable per (primitive, shape, params),
which dominates a cold classification; numpy needs no compilation.  Every
function here follows the lax semantics for the argument kinds met in
log densities; anything not covered (or raising) falls back to ``jax`` binding.
"""

from __future__ import annotations

import numpy as np
import scipy.special as sps

__all__ = ["NP_DECLINED", "NP_IMPL", "np_dot_general"]

NP_IMPL: dict = {}
# What a numpy implementation raises for an argument kind it does not cover (an
# integer where it needs floats, dynamic shapes, a parameter it does not know): the
# caller then binds the jax primitive instead.
NP_DECLINED = (TypeError, ValueError, NotImplementedError, KeyError, IndexError)

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _impl(*names):
    def deco(f):
        for n in names:
            NP_IMPL[n] = f
        return f

    return deco


def _a(x):
    return np.asarray(x)


def _unary(name, f):
    NP_IMPL[name] = lambda x, **_: f(_a(x))


def _floating_only(f):
    def g(x):
        if not np.issubdtype(x.dtype, np.inexact):
            raise TypeError("integer argument")
        return f(x)

    return g


for _n, _f in {
    "neg": np.negative,
    "sign": np.sign,
    "floor": np.floor,
    "ceil": np.ceil,
    "is_finite": np.isfinite,
    "exp": np.exp,
    "exp2": np.exp2,
    "log": np.log,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "tanh": np.tanh,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "cbrt": np.cbrt,
    "abs": np.abs,
    "square": np.square,
    "lgamma": sps.gammaln,
    "digamma": sps.digamma,
    "erf": sps.erf,
    "erfc": sps.erfc,
    "erf_inv": sps.erfinv,
    "logistic": sps.expit,
    "real": np.real,
    "imag": np.imag,
}.items():
    with np.errstate(all="ignore"):
        _unary(_n, _f)

for _n in ("copy", "copy_p", "stop_gradient", "reduce_precision", "optimization_barrier"):
    NP_IMPL[_n] = lambda x, **_: _a(x)


@_impl("not")
def _not(x, **_):
    x = _a(x)
    return np.logical_not(x) if x.dtype == bool else np.invert(x)


@_impl("round")
def _round(x, rounding_method=0, **_):
    x = _a(x)
    if int(rounding_method) == 1:  # to nearest even
        return np.round(x)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)  # away from zero


@_impl("integer_pow")
def _integer_pow(x, y, **_):
    return np.power(_a(x), int(y)) if int(y) >= 0 else 1.0 / np.power(_a(x), -int(y))


@_impl("convert_element_type")
def _convert(x, new_dtype, **_):
    return _a(x).astype(np.dtype(new_dtype))


def _binary(name, f):
    NP_IMPL[name] = lambda x, y, **_: f(_a(x), _a(y))


for _n, _f in {
    "add": np.add,
    "add_any": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
    "atan2": np.arctan2,
    "nextafter": np.nextafter,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}.items():
    _binary(_n, _f)


@_impl("div")
def _div(x, y, **_):
    x, y = _a(x), _a(y)
    if np.issubdtype(x.dtype, np.integer):
        return np.trunc(x / y).astype(x.dtype)  # lax.div truncates toward zero
    return x / y


@_impl("rem")
def _rem(x, y, **_):
    return np.fmod(_a(x), _a(y))  # sign of the dividend, like C


@_impl("pow")
def _pow(x, y, **_):
    return np.power(_a(x).astype(np.result_type(_a(x), np.float32)), _a(y))


def _logical(np_bool, np_int):
    def f(x, y, **_):
        x, y = _a(x), _a(y)
        return np_bool(x, y) if x.dtype == bool else np_int(x, y)

    return f


NP_IMPL["and"] = _logical(np.logical_and, np.bitwise_and)
NP_IMPL["or"] = _logical(np.logical_or, np.bitwise_or)
NP_IMPL["xor"] = _logical(np.logical_xor, np.bitwise_xor)


@_impl("select_n")
def _select_n(pred, *cases, **_):
    pred = _a(pred)
    cases = [_a(c) for c in cases]
    if len(cases) == 2:
        return np.where(pred.astype(bool), cases[1], cases[0])
    shape = np.broadcast_shapes(pred.shape, *[c.shape for c in cases])
    return np.choose(
        np.broadcast_to(pred.astype(np.int64), shape), [np.broadcast_to(c, shape) for c in cases]
    )


@_impl("clamp")
def _clamp(lo, x, hi, **_):
    return np.minimum(np.maximum(_a(x), _a(lo)), _a(hi))


# -- structure -------------------------------------------------------------------


@_impl("broadcast_in_dim")
def _bid(x, *dyn, shape, broadcast_dimensions, **_):
    if dyn:
        raise TypeError("dynamic shapes")
    x = _a(x)
    new = [1] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        new[d] = x.shape[i]
    return np.broadcast_to(x.reshape(new), shape)


@_impl("reshape")
def _reshape(x, *dyn, new_sizes, dimensions=None, **_):
    if dyn or dimensions is not None:
        raise TypeError("unsupported reshape")
    return _a(x).reshape(new_sizes)


@_impl("squeeze")
def _squeeze(x, dimensions, **_):
    return np.squeeze(_a(x), axis=tuple(dimensions))


@_impl("expand_dims")
def _expand_dims(x, dimensions, **_):
    return np.expand_dims(_a(x), tuple(dimensions))


@_impl("transpose")
def _transpose(x, permutation, **_):
    return np.transpose(_a(x), permutation)


@_impl("rev")
def _rev(x, dimensions, **_):
    return np.flip(_a(x), axis=tuple(dimensions))


@_impl("slice")
def _slice(x, start_indices, limit_indices, strides=None, **_):
    strides = strides or (1,) * len(start_indices)
    return _a(x)[tuple(slice(a, b, s) for a, b, s in zip(start_indices, limit_indices, strides))]


@_impl("concatenate")
def _concatenate(*xs, dimension, **_):
    return np.concatenate([_a(x) for x in xs], axis=dimension)


@_impl("stack")
def _stack(*xs, axis, **_):
    return np.stack([_a(x) for x in xs], axis=axis)


@_impl("pad")
def _pad(x, padval, padding_config, **_):
    x = _a(x)
    if any(i != 0 for _, _, i in padding_config) or any(
        lo < 0 or hi < 0 for lo, hi, _ in padding_config
    ):
        raise TypeError("interior or negative padding")
    return np.pad(x, [(lo, hi) for lo, hi, _ in padding_config], constant_values=_a(padval))


@_impl("iota")
def _iota(*dyn, dtype, shape, dimension, **_):
    if dyn:
        raise TypeError("dynamic shapes")
    r = np.arange(shape[dimension], dtype=np.dtype(dtype))
    new = [1] * len(shape)
    new[dimension] = shape[dimension]
    return np.broadcast_to(r.reshape(new), shape)


@_impl("split")
def _split(x, sizes, axis, **_):
    return list(np.split(_a(x), np.cumsum(sizes)[:-1], axis=axis))


# -- reductions --------------------------------------------------------------------


def _reduce(f):
    def g(x, axes, **_):
        return f(_a(x), axis=tuple(axes))

    return g


NP_IMPL["reduce_sum"] = _reduce(np.sum)
NP_IMPL["reduce_max"] = _reduce(np.max)
NP_IMPL["reduce_min"] = _reduce(np.min)
NP_IMPL["reduce_prod"] = _reduce(np.prod)
NP_IMPL["reduce_and"] = _reduce(np.all)
NP_IMPL["reduce_or"] = _reduce(np.any)


def _arg(f):
    def g(x, axes, index_dtype, **_):
        (axis,) = axes
        return f(_a(x), axis=axis).astype(np.dtype(index_dtype))

    return g


NP_IMPL["argmax"] = _arg(np.argmax)
NP_IMPL["argmin"] = _arg(np.argmin)


@_impl("cumsum")
def _cumsum(x, axis, reverse=False, **_):
    x = _a(x)
    if reverse:
        return np.flip(np.cumsum(np.flip(x, axis), axis=axis), axis)
    return np.cumsum(x, axis=axis)


def np_dot_general(a, b, dimension_numbers):
    """numpy version of lax.dot_general (output: batch, lhs free, rhs free)."""
    (lc, rc), (lb, rb) = dimension_numbers
    la = [None] * np.ndim(a)
    lbl = [None] * np.ndim(b)
    it = iter(_LETTERS)
    for i, j in zip(lb, rb):
        la[i] = lbl[j] = next(it)
    for i, j in zip(lc, rc):
        la[i] = lbl[j] = next(it)
    for k in range(len(la)):
        if la[k] is None:
            la[k] = next(it)
    for k in range(len(lbl)):
        if lbl[k] is None:
            lbl[k] = next(it)
    out = [la[i] for i in lb]
    out += [la[k] for k in range(len(la)) if k not in lc and k not in lb]
    out += [lbl[k] for k in range(len(lbl)) if k not in rc and k not in rb]
    spec = f"{''.join(la)},{''.join(lbl)}->{''.join(out)}"
    return np.einsum(spec, _a(a), _a(b), optimize=True)


@_impl("dot_general")
def _dot_general(a, b, dimension_numbers, **_):
    return np_dot_general(a, b, dimension_numbers)


# -- indexing -------------------------------------------------------------------------


def _place(arr, positions, rank):
    new = [1] * rank
    for i, p in enumerate(positions):
        new[p] = arr.shape[i]
    return arr.reshape(new)


@_impl("gather")
def _gather(operand, indices, dimension_numbers, slice_sizes, mode=None, fill_value=None, **_):
    """lax.gather (index_vector_dim is the last axis of ``indices``, as in jax)."""
    dn = dimension_numbers
    operand, indices = _a(operand), _a(indices).astype(np.int64)
    batch_shape = indices.shape[:-1]
    out_rank = len(batch_shape) + len(dn.offset_dims)
    batch_pos = [d for d in range(out_rank) if d not in dn.offset_dims]
    starts = [np.zeros(batch_shape, np.int64) for _ in range(operand.ndim)]
    for k, d in enumerate(dn.start_index_map):
        starts[d] = indices[..., k]
    obd = getattr(dn, "operand_batching_dims", ())
    sbd = getattr(dn, "start_indices_batching_dims", ())
    for od, bd in zip(obd, sbd):
        starts[od] = np.broadcast_to(
            _place(np.arange(batch_shape[bd]), [bd], len(batch_shape)), batch_shape
        )
    fill = "FILL_OR_DROP" in str(mode)
    oob = np.zeros(batch_shape, bool)
    for d in range(operand.ndim):
        hi = operand.shape[d] - slice_sizes[d]
        if fill:
            oob |= (starts[d] < 0) | (starts[d] > hi)
        starts[d] = np.clip(starts[d], 0, hi)
    offset_dims_operand = [
        d for d in range(operand.ndim) if d not in dn.collapsed_slice_dims and d not in obd
    ]
    idx = []
    for d in range(operand.ndim):
        s = _place(starts[d], batch_pos, out_rank)
        if d in offset_dims_operand:
            od = dn.offset_dims[offset_dims_operand.index(d)]
            s = s + _place(np.arange(slice_sizes[d]), [od], out_rank)
        idx.append(s)
    out = operand[tuple(idx)]
    if fill and oob.any():
        if fill_value is None:
            fill_value = np.nan if np.issubdtype(operand.dtype, np.inexact) else 0
        out = np.where(_place(oob, batch_pos, out_rank), fill_value, out)
    return out


@_impl("dynamic_slice")
def _dynamic_slice(operand, *starts, slice_sizes, **_):
    operand = _a(operand)
    sl = []
    for d, s in enumerate(starts):
        s = int(np.clip(int(_a(s)), 0, operand.shape[d] - slice_sizes[d]))
        sl.append(slice(s, s + slice_sizes[d]))
    return operand[tuple(sl)]


@_impl("dynamic_update_slice")
def _dynamic_update_slice(operand, update, *starts, **_):
    operand, update = _a(operand).copy(), _a(update)
    sl = []
    for d, s in enumerate(starts):
        s = int(np.clip(int(_a(s)), 0, operand.shape[d] - update.shape[d]))
        sl.append(slice(s, s + update.shape[d]))
    operand[tuple(sl)] = update
    return operand
