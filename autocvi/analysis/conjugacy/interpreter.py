"""Abstract interpretation of a jaxpr over the sufficient-statistic atoms of one latent.

Every equation is evaluated twice over:

* *concretely*, lazily, at a few valid draws of the target (other latents held at
  their example values) -- only where a rule needs numbers: guards
  (comparisons, ``select_n`` predicates, ``max``/``min``/``abs``, ``argmax``...);
* *abstractly*, on the :mod:`~autocvi.conjugacy.algebra` domain (CONST /
  polynomial in ``z``, ``log z``, ``log(1-z)``, ``indicator(z)`` / OPAQUE).

Rules live in the ``RULES`` registry keyed by primitive name.  A primitive
without a rule that touches the target makes its output OPAQUE, recording the
primitive.  Calls (``jit``, ``custom_jvp_call``, ``custom_vjp_call``,
``closed_call``, ``remat``, ``cond`` on a resolved index) are entered.

Guards are resolved by the *almost-sure branch* rule: a target-dependent
predicate whose concrete value is identical (elementwise) at every draw is a
constant.  When a guard differs between draws the value is OPAQUE with
``piecewise=True``; the caller may then re-run the analysis once per draw
(each run resolves every guard at its own draw) and accept the result if all
runs give the same polynomial (e.g. ``softplus`` written as
``max(x, 0) + log1p(exp(-|x|))``).

Discrete targets (Categorical, Bernoulli) use the same walk: every function of
a discrete ``z`` is affine in its one-hot indicator, so nonlinear operations map
to ``indicator(z)``; only *which elements* of ``z`` each output element depends
on is tracked (a function of several elements at once is a ``cross`` term).
"""

from __future__ import annotations

import os

import numpy as np

from ...jaxpr import bind, closed_parts, interpret
from . import algebra as A
from .algebra import CONST, IND, IND_CROSS, Ctx, Mono, Opaque, Origin, Poly, Term
from .npeval import NP_DECLINED, NP_IMPL, np_dot_general

__all__ = ["Interpreter", "Val", "RULES"]


class Val:
    """One jaxpr variable: abstract value + (lazy) concrete values at the draws."""

    __slots__ = ("abs", "const", "_thunk", "_conc")

    def __init__(self, abs=None, const=None, thunk=None):
        self.abs = abs  # None (independent of the target) | Poly | Opaque
        self.const = const  # concrete value when independent
        self._thunk = thunk  # () -> list of concrete values, one per draw
        self._conc = None

    @property
    def dep(self) -> bool:
        return self.abs is not None

    def conc(self) -> list:
        if self._conc is None:
            self._conc = [np.asarray(x) for x in self._thunk()]
        return self._conc

    def at(self, d: int):
        return self.const if self.abs is None else self.conc()[d]


def prim_bind(eqn, args, params=None):
    """Bind ``eqn``'s primitive on concrete arrays: numpy when implemented, else jax."""
    params = eqn.params if params is None else params
    f = NP_IMPL.get(eqn.primitive.name)
    if f is not None:
        try:
            with np.errstate(all="ignore"):
                return f(*args, **params)
        except NP_DECLINED:  # a case the numpy version does not cover: jax computes it
            pass
    return eqn.primitive.bind(*args, **params)


def bind_eqn(eqn, args) -> list:
    """Evaluate one equation on concrete arguments (numpy first); a list of outputs."""
    f = NP_IMPL.get(eqn.primitive.name)
    if f is not None:
        try:
            with np.errstate(all="ignore"):
                out = f(*args, **eqn.params)
        except NP_DECLINED:  # a case the numpy version does not cover: jax computes it
            pass
        else:
            if eqn.primitive.multiple_results:
                return [np.asarray(o, dtype=v.aval.dtype) for o, v in zip(out, eqn.outvars)]
            return [np.asarray(out, dtype=eqn.outvars[0].aval.dtype)]
    return bind(eqn, args)


def eval_concrete(jaxpr, consts, args) -> list:
    """Plain evaluation of a jaxpr (numpy first, calls entered), like ``jax.core.eval_jaxpr``."""

    def evaluate(eqn, ins):
        if eqn.primitive.name == "cond":
            k = int(np.clip(np.asarray(ins[0]), 0, len(eqn.params["branches"]) - 1))
            return eval_concrete(*closed_parts(eqn.params["branches"][k]), ins[1:])
        return bind_eqn(eqn, ins)

    return interpret(jaxpr, consts, args, evaluate)


def _aval_shape(var) -> tuple:
    return tuple(var.aval.shape)


# Frames inside these packages are not the user's code (autocvi's own directory by
# path, so a checkout in a folder named e.g. "autocvi" still shows the user's lines).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIBRARY_DIRS = (
    _PACKAGE_DIR + os.sep,
    os.sep + "jax" + os.sep,
    os.sep + "jaxlib" + os.sep,
    os.sep + "numpyro" + os.sep,
)


def _user_source(eqn) -> str:
    """file:line of the first frame outside jax / numpyro / autocvi, if any."""
    try:
        frames = eqn.source_info.traceback.frames
    except Exception:  # pragma: no cover - depends on jax internals
        return ""
    for f in frames:
        fn = f.file_name
        if any(s in fn for s in _LIBRARY_DIRS) or fn.startswith("<") or "site-packages" in fn:
            continue
        return f"{os.path.basename(fn)}:{f.line_num}"
    return ""


def _same_across(arrs: list) -> bool:
    a0 = arrs[0]
    for a in arrs[1:]:
        if a.shape != a0.shape:
            return False
        if np.issubdtype(a0.dtype, np.floating):
            if not np.array_equal(a0, a, equal_nan=True):
                return False
        elif not np.array_equal(a0, a):
            return False
    return True


def _phrase(desc: str) -> str:
    if not desc:
        return "a constant"
    if desc.startswith(("linear", "quadratic")):
        return f"an expression {desc}"
    return desc


class Interpreter:
    """Walks a (closed) jaxpr; ``draws`` are concrete values of the target."""

    def __init__(self, ctx: Ctx, draws: list):
        self.ctx = ctx
        self.draws = draws
        self.D = len(draws)

    # -- values -------------------------------------------------------------

    def target_val(self, shape) -> Val:
        ctx = self.ctx
        ones = np.ones(shape, ctx.cdtype)
        idx = None if ctx.scalar else np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        mono = IND if ctx.discrete else Mono(zp=1.0)
        draws = self.draws
        return Val(Poly({mono: Term(ones, idx)}, shape), thunk=lambda: list(draws))

    def thunk(self, eqn, ins):
        """Memoised concrete evaluation of ``eqn`` at every draw."""
        cache = []

        def run():
            if not cache:
                per = []
                for d in range(self.D):
                    per.append(bind_eqn(eqn, [v.at(d) for v in ins]))
                cache.append(per)
            return cache[0]

        return run

    def wrap(self, eqn, ins, results) -> list[Val]:
        th = None
        out = []
        for i, r in enumerate(results):
            if isinstance(r, Val):
                out.append(r)
            elif isinstance(r, (Poly, Opaque)):
                if th is None:
                    th = self.thunk(eqn, ins)
                out.append(Val(r, thunk=(lambda i=i, th=th: [p[i] for p in th()])))
            else:
                out.append(Val(None, const=r))
        return out

    # -- opaque bookkeeping ---------------------------------------------------

    def new_opaque(self, eqn, ins, message=None, kind="opaque", piecewise=False, desc=None):
        prim = eqn.primitive.name
        dep = [v for v in ins if v.dep]
        inner = A.describe(self.ctx, dep[0].abs) if dep else ""
        if message is None:
            message = f"`{prim}` is applied to {_phrase(inner)}"
        if desc is None:
            desc = f"{prim}({inner})"
        origin = Origin(prim, message, _user_source(eqn), piecewise, kind)
        return Opaque(origin, desc, piecewise)

    def propagate(self, eqn, ins, linear=False):
        ops = [v.abs for v in ins if isinstance(v.abs, Opaque)]
        first = ops[0]
        pw = any(o.piecewise for o in ops)
        name = eqn.primitive.name
        wrap = not linear and name in ELEMENTWISE and name not in PIECEWISE_CONST
        wrap = wrap and name not in ("select_n", "convert_element_type", "copy", "copy_p")
        desc = f"{name}({first.desc})" if wrap else first.desc
        if len(desc) > 80:
            desc = first.desc
        return Opaque(first.origin, desc, pw)

    def piecewise(self, eqn, ins, what="its outcome"):
        s = self.ctx.name
        dep = [v for v in ins if v.dep]
        inner = A.describe(self.ctx, dep[0].abs) if dep else ""
        msg = (
            f"`{eqn.primitive.name}` on {_phrase(inner)} makes the log density piecewise in {s} "
            f"({what} differs between draws of {s})"
        )
        return self.new_opaque(
            eqn, ins, message=msg, kind="piecewise", piecewise=True, desc=f"piecewise in {s}"
        )

    # -- the walk -------------------------------------------------------------

    def eval_jaxpr(self, jaxpr, consts, args: list[Val]) -> list[Val]:
        """Walk ``jaxpr`` (calls entered by the shared walker) on abstract values."""
        return interpret(
            jaxpr,
            consts,
            args,
            self.eval_eqn,
            literal=lambda lit: Val(None, const=lit.val),
            const=lambda var, c: Val(None, const=c),
        )

    def eval_eqn(self, eqn, ins: list[Val]) -> list[Val]:
        name = eqn.primitive.name
        if not any(v.dep for v in ins):
            if name in RULED_WHEN_CONSTANT:
                return RULES[name](self, eqn, ins)
            return [Val(None, const=o) for o in bind_eqn(eqn, [v.const for v in ins])]
        rule = RULES.get(name)
        if self.ctx.discrete and name not in DISCRETE_SAFE:
            rule = discrete_rule
        if any(isinstance(v.abs, Opaque) for v in ins) and name not in OPAQUE_AWARE:
            o = self.propagate(eqn, ins, linear=name in LINEAR_NAMES)
            return self.wrap(eqn, ins, [o] * len(eqn.outvars))
        if rule is None:
            o = self.new_opaque(eqn, ins)
            return self.wrap(eqn, ins, [o] * len(eqn.outvars))
        return self.wrap(eqn, ins, rule(self, eqn, ins))

    # -- helpers for rules ----------------------------------------------------

    def arg(self, v: Val):
        return v.abs if v.dep else np.asarray(v.const)

    def resolve(self, arrs: list):
        """The common concrete value of a guard at all draws, or None."""
        if self.D == 0:
            return None
        return arrs[0] if _same_across(arrs) else None


# ---------------------------------------------------------------------------
# rules
# ---------------------------------------------------------------------------

RULES: dict = {}


def rule(*names):
    def deco(f):
        for n in names:
            RULES[n] = f
        return f

    return deco


def _cast_for(var, x):
    dt = var.aval.dtype
    if np.issubdtype(dt, np.floating):
        return np.asarray(x, dtype=dt)
    return np.asarray(x)


def _bind_coef(eqn, pos, c, consts: dict, ctx: Ctx, extra_params=None):
    """Bind ``eqn``'s primitive with ``c`` at operand ``pos`` and constants elsewhere."""
    args = []
    for k, v in enumerate(eqn.invars):
        if k == pos:
            args.append(_cast_for(v, c))
        else:
            args.append(consts[k])
    params = dict(eqn.params)
    if extra_params:
        params.update(extra_params)
    return prim_bind(eqn, args, params)


def _np_broadcast_in_dim(x, shape, dims):
    new = [1] * len(shape)
    for i, d in enumerate(dims):
        new[d] = x.shape[i]
    return np.broadcast_to(np.reshape(x, new), shape)


def _np_struct(eqn):
    """A numpy implementation of a structural primitive, or None."""
    name, p = eqn.primitive.name, eqn.params
    if name in ("convert_element_type", "copy", "copy_p", "reduce_precision", "stop_gradient"):
        return lambda x: x
    if name == "broadcast_in_dim":
        return lambda x: _np_broadcast_in_dim(x, p["shape"], p["broadcast_dimensions"])
    if name == "reshape" and p.get("dimensions") is None:
        return lambda x: np.reshape(x, p["new_sizes"])
    if name == "squeeze":
        return lambda x: np.squeeze(x, axis=tuple(p["dimensions"]))
    if name == "transpose":
        return lambda x: np.transpose(x, p["permutation"])
    if name == "rev":
        return lambda x: np.flip(x, axis=tuple(p["dimensions"]))
    if name == "slice":
        strides = p["strides"] or (1,) * len(p["start_indices"])
        sl = tuple(
            slice(a, b, s) for a, b, s in zip(p["start_indices"], p["limit_indices"], strides)
        )
        return lambda x: x[sl]
    return None


STRUCT_NAMES = (
    "broadcast_in_dim",
    "reshape",
    "squeeze",
    "expand_dims",
    "transpose",
    "rev",
    "slice",
    "copy",
    "copy_p",
    "reduce_precision",
    "stop_gradient",
    "real",
)


@rule(*STRUCT_NAMES, "convert_element_type")
def r_struct(it: Interpreter, eqn, ins):
    ctx = it.ctx
    if any(v.dep for v in ins[1:]):
        return discrete_rule(it, eqn, ins) if ctx.discrete else [it.new_opaque(eqn, ins)]
    name = eqn.primitive.name
    if name == "convert_element_type" and not ctx.discrete:
        new = np.dtype(eqn.params["new_dtype"])
        if not np.issubdtype(new, np.floating):
            return r_piecewise_const(it, eqn, ins)
    p = ins[0].abs
    shape = _aval_shape(eqn.outvars[0])
    f = _np_struct(eqn)
    if f is None:
        consts = {k: v.const for k, v in enumerate(ins)}
        var0 = eqn.invars[0]

        def fc(c):
            return np.asarray(_bind_coef(eqn, 0, c, consts, ctx), dtype=ctx.cdtype)

        def fi(i):
            x = _bind_coef(eqn, 0, i.astype(var0.aval.dtype), consts, ctx)
            return np.rint(np.asarray(x)).astype(np.int64)
    else:
        fc = fi = f
    return [A.map_struct(p, fc, fi, shape)]


def _fill_struct(it, eqn, ins, pos, fill_param=None):
    """Structural op on operand ``pos`` with constant other operands (gather, dynamic_slice)."""
    ctx = it.ctx
    p = ins[pos].abs
    shape = _aval_shape(eqn.outvars[0])
    consts = {k: v.const for k, v in enumerate(ins)}
    var = eqn.invars[pos]
    idt = var.aval.dtype if np.issubdtype(var.aval.dtype, np.floating) else np.float64

    def fc(c):
        extra = {fill_param: 0.0} if fill_param else None
        return np.asarray(_bind_coef(eqn, pos, c, consts, ctx, extra), dtype=ctx.cdtype)

    def fi(i):
        extra = {fill_param: -1.0} if fill_param else None
        x = _bind_coef(eqn, pos, i.astype(idt), consts, ctx, extra)
        return np.rint(np.asarray(x)).astype(np.int64)

    return [A.map_struct(p, fc, fi, shape)]


@rule("gather")
def r_gather(it, eqn, ins):
    if ins[1].dep:
        return discrete_rule(it, eqn, ins) if it.ctx.discrete else [it.new_opaque(eqn, ins)]
    return _fill_struct(it, eqn, ins, 0, "fill_value")


@rule("dynamic_slice")
def r_dynamic_slice(it, eqn, ins):
    if any(v.dep for v in ins[1:]):
        return discrete_rule(it, eqn, ins) if it.ctx.discrete else [it.new_opaque(eqn, ins)]
    return _fill_struct(it, eqn, ins, 0)


def _multi_operand(it, eqn, ins, positions, combine_idx=True):
    """Ops linear in several operands (concatenate, dynamic_update_slice, scatter, pad)."""
    ctx = it.ctx
    shape = _aval_shape(eqn.outvars[0])
    polys = {}
    for k in positions:
        v = ins[k]
        var = eqn.invars[k]
        if v.dep:
            polys[k] = v.abs
        else:
            polys[k] = A.const_poly(ctx, v.const, _aval_shape(var))
    monos = []
    for p in polys.values():
        for m in p.terms:
            if m not in monos:
                monos.append(m)
    consts = {k: v.const for k, v in enumerate(ins) if k not in positions}

    def bind_int(arrs):
        fargs = [
            _cast_for(eqn.invars[k], arrs[k].astype(np.float64)) if k in arrs else consts[k]
            for k in range(len(ins))
        ]
        return np.rint(np.asarray(prim_bind(eqn, fargs))).astype(np.int64)

    terms = {}
    for m in monos:
        cs, ids, mixed = {}, {}, False
        for k in positions:
            t = polys[k].terms.get(m)
            shp = _aval_shape(eqn.invars[k])
            if t is None:
                cs[k] = np.zeros(shp, ctx.cdtype)
                ids[k] = np.full(shp, -1, np.int64)
            elif t.c is None:
                mixed = True
            else:
                cs[k] = np.broadcast_to(t.c, shp)
                ids[k] = (
                    np.broadcast_to(t.idx, shp) if t.idx is not None else np.full(shp, -1, np.int64)
                )
        if mixed:
            if ctx.scalar:
                terms[m] = Term(None)
                continue
            gs = {}
            for k in positions:
                shp = _aval_shape(eqn.invars[k])
                t = polys[k].terms.get(m)
                gs[k] = np.full(shp, -1, np.int64) if t is None else A.group_map(ctx, t, shp)
            terms[m] = A.inexact(ctx, bind_int(gs))
            continue
        args = [_cast_for(eqn.invars[k], cs[k]) if k in cs else consts[k] for k in range(len(ins))]
        c = np.asarray(prim_bind(eqn, args), dtype=ctx.cdtype)
        if m == CONST or ctx.scalar:
            terms[m] = Term(c)
        elif not combine_idx:
            terms[m] = Term(None)
        else:
            terms[m] = Term(c, bind_int(ids))
    return [Poly(A._drop_zero(terms), shape)]


@rule("concatenate", "stack")
def r_concatenate(it, eqn, ins):
    return _multi_operand(it, eqn, ins, list(range(len(ins))))


@rule("dynamic_update_slice")
def r_dus(it, eqn, ins):
    if any(v.dep for v in ins[2:]):
        return discrete_rule(it, eqn, ins) if it.ctx.discrete else [it.new_opaque(eqn, ins)]
    return _multi_operand(it, eqn, ins, [0, 1])


@rule("scatter", "scatter-add", "scatter_add")
def r_scatter(it, eqn, ins):
    if ins[1].dep:
        return discrete_rule(it, eqn, ins) if it.ctx.discrete else [it.new_opaque(eqn, ins)]
    return _multi_operand(it, eqn, ins, [0, 2], combine_idx=eqn.primitive.name == "scatter")


@rule("pad")
def r_pad(it, eqn, ins):
    if ins[1].dep:
        return discrete_rule(it, eqn, ins) if it.ctx.discrete else [it.new_opaque(eqn, ins)]
    return _multi_operand(it, eqn, ins, [0, 1])


@rule("split")
def r_split(it, eqn, ins):
    ctx = it.ctx
    p = ins[0].abs
    outs = []
    for j, var in enumerate(eqn.outvars):
        shape = _aval_shape(var)

        def fc(c, j=j):
            return np.asarray(prim_bind(eqn, [_cast_for(eqn.invars[0], c)])[j], ctx.cdtype)

        def fi(i, j=j):
            x = prim_bind(eqn, [_cast_for(eqn.invars[0], i.astype(np.float64))])
            return np.rint(np.asarray(x[j])).astype(np.int64)

        outs.append(A.map_struct(p, fc, fi, shape))
    return outs


# -- arithmetic ---------------------------------------------------------------


@rule("add", "add_any")
def r_add(it, eqn, ins):
    shape = _aval_shape(eqn.outvars[0])
    return [A.add(it.ctx, it.arg(ins[0]), it.arg(ins[1]), shape)]


@rule("sub")
def r_sub(it, eqn, ins):
    ctx = it.ctx
    shape = _aval_shape(eqn.outvars[0])
    b = it.arg(ins[1])
    nb = A.neg(ctx, A.broadcast(b, shape)) if isinstance(b, Poly) else -b
    return [A.add(ctx, it.arg(ins[0]), nb, shape)]


@rule("neg")
def r_neg(it, eqn, ins):
    return [A.neg(it.ctx, ins[0].abs)]


def _cross_opaque(it, eqn, ins):
    s = it.ctx.name
    da = A.describe(it.ctx, ins[0].abs) if ins[0].dep else "a constant"
    db = A.describe(it.ctx, ins[1].abs) if ins[1].dep else "a constant"
    msg = (
        f"`{eqn.primitive.name}` combines {_phrase(da)} with {_phrase(db)} at different "
        f"elements of {s} non-polynomially"
    )
    return it.new_opaque(eqn, ins, message=msg, kind="cross")


@rule("mul")
def r_mul(it, eqn, ins):
    shape = _aval_shape(eqn.outvars[0])
    a, b = it.arg(ins[0]), it.arg(ins[1])
    r = A.mul(it.ctx, a, b, shape)
    if r is None and A.product_size(a, b) > A.MAX_TERMS:
        return [_too_many_terms(it, eqn, ins, a, b)]
    return [r if r is not None else _cross_opaque(it, eqn, ins)]


def _too_many_terms(it, eqn, ins, a, b):
    """A product past the algebra's size (a degree that doubles at every step of a scan's
    carry): not tracked, and not a conjugate form of any family."""
    s, n = it.ctx.name, A.MAX_TERMS
    msg = (
        f"`mul` makes a product of {_phrase(A.describe(it.ctx, a))} and "
        f"{_phrase(A.describe(it.ctx, b))}: "
        f"more than {n} powers of {s}, not tracked (a product whose degree in {s} grows at "
        "every step, as in a scan's carry)"
    )
    return it.new_opaque(eqn, ins, message=msg)


@rule("div")
def r_div(it, eqn, ins):
    ctx = it.ctx
    shape = _aval_shape(eqn.outvars[0])
    a, b = it.arg(ins[0]), it.arg(ins[1])
    if not ins[1].dep:
        with np.errstate(divide="ignore"):
            inv = 1.0 / np.asarray(b, dtype=ctx.cdtype)
        return [A.scale(ctx, A.broadcast(a, shape), inv)]
    if ctx.discrete:
        return discrete_rule(it, eqn, ins)
    inv = A.power(ctx, A.broadcast(b, shape), -1.0)
    if inv is None:
        inner = A.describe(ctx, b)
        return [it.new_opaque(eqn, ins, message=f"`div` divides by {_phrase(inner)}")]
    r = A.mul(ctx, a, inv, shape)
    return [r if r is not None else _cross_opaque(it, eqn, ins)]


def _unary(fn):
    def r(it, eqn, ins):
        res = fn(it.ctx, ins[0].abs)
        return [res if res is not None else it.new_opaque(eqn, ins)]

    return r


RULES["log"] = _unary(A.log)
RULES["exp"] = _unary(A.exp)
RULES["log1p"] = _unary(lambda ctx, p: A.log(ctx, A.add(ctx, p, 1.0, p.shape)))
RULES["sqrt"] = _unary(lambda ctx, p: A.power(ctx, p, 0.5))
RULES["rsqrt"] = _unary(lambda ctx, p: A.power(ctx, p, -0.5))
RULES["cbrt"] = _unary(lambda ctx, p: A.power(ctx, p, 1.0 / 3.0))
RULES["square"] = _unary(lambda ctx, p: A.power(ctx, p, 2.0))


def _expm1(ctx, p):
    e = A.exp(ctx, p)
    return None if e is None else A.add(ctx, e, -1.0, p.shape)


def _exp2(ctx, p):
    return A.exp(ctx, A.scale(ctx, p, np.log(2.0)))


def _logistic(ctx, p):
    e = A.exp(ctx, A.neg(ctx, p))
    if e is None:
        return None
    return A.power(ctx, A.add(ctx, e, 1.0, p.shape), -1.0)


RULES["expm1"] = _unary(_expm1)
RULES["exp2"] = _unary(_exp2)
RULES["logistic"] = _unary(_logistic)


@rule("integer_pow")
def r_integer_pow(it, eqn, ins):
    res = A.power(it.ctx, ins[0].abs, float(eqn.params["y"]))
    return [res if res is not None else it.new_opaque(eqn, ins)]


@rule("pow")
def r_pow(it, eqn, ins):
    ctx = it.ctx
    shape = _aval_shape(eqn.outvars[0])
    x, y = ins
    if x.dep and not y.dep:
        res = A.power(ctx, A.broadcast(x.abs, shape), np.asarray(y.const))
    elif y.dep and not x.dep:
        base = np.asarray(x.const, dtype=float)
        if np.all(base > 0):
            res = A.exp(ctx, A.scale(ctx, A.broadcast(y.abs, shape), np.log(base)))
        else:
            res = None
    else:
        res = None
    return [res if res is not None else it.new_opaque(eqn, ins)]


# -- linear maps that may mix elements ------------------------------------------


@rule("reduce_sum")
def r_reduce_sum(it, eqn, ins):
    axes = tuple(eqn.params["axes"])
    shape = _aval_shape(eqn.outvars[0])
    return [
        A.linear(
            it.ctx,
            ins[0].abs,
            lambda c: np.sum(c, axis=axes),
            shape,
            idx_rule=lambda t: A.reduce_idx(t, axes),
            grp_rule=lambda g: A.reduce_groups(g, axes),
        )
    ]


@rule("cumsum")
def r_cumsum(it, eqn, ins):
    ctx = it.ctx
    shape = _aval_shape(eqn.outvars[0])
    axis = int(eqn.params["axis"])
    consts = {}

    def f(c):
        return np.asarray(_bind_coef(eqn, 0, c, consts, ctx), dtype=ctx.cdtype)

    def idx_rule(t):
        hi = A.reduce_idx(t, (axis,))
        if hi is None:
            return None
        return np.broadcast_to(np.expand_dims(hi, axis), shape)

    grule = _along_axis(axis, shape)
    return [A.linear(ctx, ins[0].abs, f, shape, idx_rule=idx_rule, grp_rule=grule)]


def _along_axis(axis, shape):
    """Group rule of a map mixing entries along one axis (cumsum, triangular solves)."""

    def rule_(g):
        return np.broadcast_to(np.expand_dims(A.reduce_groups(g, (axis,)), axis), shape)

    return rule_


def _dot_idx_rule(dn, side: int, const):
    """Index map through a dot_general with a constant operand.

    An output element stays single-element when all the (nonzero) products it
    sums involve the same element of z: with n_k = 1[A != 0] 1[c != 0] the
    weights, that is sum n * (sum n idx^2) == (sum n idx)^2.
    """
    nza = (np.asarray(const) != 0).astype(np.float64)

    def f(x):
        return np_dot_general(x, nza, dn) if side == 0 else np_dot_general(nza, x, dn)

    def rule_(t):
        nz = (t.c != 0).astype(np.float64)
        i = t.idx.astype(np.float64)
        s0, s1, s2 = f(nz), f(nz * i), f(nz * i * i)
        if not np.all(s0 * s2 == s1 * s1):
            return None
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(s0 > 0, np.rint(s1 / np.where(s0 > 0, s0, 1)), -1).astype(np.int64)

    return rule_


def _dot_grp_rule(dn, side: int, const):
    """Group map through a dot_general with a constant operand (entrywise)."""
    nza = (np.asarray(const) != 0).astype(np.float64)

    def f(x):
        return np_dot_general(x, nza, dn) if side == 0 else np_dot_general(nza, x, dn)

    def rule_(g):
        act = (g >= 0).astype(np.float64)
        gg = np.where(g >= 0, g, 0).astype(np.float64)
        s0, s1, s2 = f(act), f(act * gg), f(act * gg * gg)
        poison = f((g == -2).astype(np.float64)) > 0
        single = s0 * s2 == s1 * s1
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.rint(s1 / np.where(s0 > 0, s0, 1)).astype(np.int64)
        return np.where(poison | ~single, -2, np.where(s0 > 0, mean, -1))

    return rule_


@rule("dot_general")
def r_dot_general(it, eqn, ins):
    ctx = it.ctx
    shape = _aval_shape(eqn.outvars[0])
    dn = eqn.params["dimension_numbers"]
    lhs, rhs = ins

    def dot(a, b):
        a = np.asarray(a, dtype=ctx.cdtype)
        b = np.asarray(b, dtype=ctx.cdtype)
        return np.asarray(np_dot_general(a, b, dn), dtype=ctx.cdtype).reshape(shape)

    if not lhs.dep:
        rule_, grule = _dot_idx_rule(dn, 1, lhs.const), _dot_grp_rule(dn, 1, lhs.const)
        f = lambda c: dot(lhs.const, c)  # noqa: E731
        return [A.linear(ctx, rhs.abs, f, shape, idx_rule=rule_, grp_rule=grule)]
    if not rhs.dep:
        rule_, grule = _dot_idx_rule(dn, 0, rhs.const), _dot_grp_rule(dn, 0, rhs.const)
        f = lambda c: dot(c, rhs.const)  # noqa: E731
        return [A.linear(ctx, lhs.abs, f, shape, idx_rule=rule_, grp_rule=grule)]
    # bilinear in two target-dependent operands
    (lc, rc), (lb, rb) = dn
    nb = len(lb)
    nlf = len(lhs.abs.shape) - len(lc) - len(lb)

    def side_groups(g, side):
        """Groups met along the contraction, laid out in the output's dimensions."""
        contract, batch = (lc, lb) if side == 0 else (rc, rb)
        red = A.reduce_groups(g, tuple(contract))
        remaining = [d for d in range(g.ndim) if d not in contract]
        free = [d for d in range(g.ndim) if d not in contract and d not in batch]
        red = np.transpose(red, [remaining.index(d) for d in list(batch) + free])
        if side == 0:
            dims = list(range(nb + len(free)))
        else:
            dims = list(range(nb)) + list(range(nb + nlf, nb + nlf + len(free)))
        return _np_broadcast_in_dim(red, shape, dims)

    out: dict = {}
    for m1, t1 in lhs.abs.terms.items():
        for m2, t2 in rhs.abs.terms.items():
            if ctx.scalar:
                if t1.c is None or t2.c is None:
                    A.emit(ctx, out, m1.times(m2), Term(None))
                else:
                    A.emit(ctx, out, m1.times(m2), Term(dot(t1.c, t2.c)))
                continue
            if m1 == CONST and m2 == CONST:
                A.emit(ctx, out, CONST, Term(dot(t1.c, t2.c)))
                continue
            if m1 == CONST or m2 == CONST:  # linear in the other operand
                side, t, const = (1, t2, t1.c) if m1 == CONST else (0, t1, t2.c)
                g = A.group_map(ctx, t, lhs.abs.shape if side == 0 else rhs.abs.shape)
                A.emit(ctx, out, m1.times(m2), A.inexact(ctx, _dot_grp_rule(dn, side, const)(g)))
                continue
            if not ctx.discrete and not (m1.is_polynomial() and m2.is_polynomial()):
                return [_cross_opaque(it, eqn, ins)]
            gl = side_groups(A.group_map(ctx, t1, lhs.abs.shape), 0)
            gr = side_groups(A.group_map(ctx, t2, rhs.abs.shape), 1)
            g = A.product_groups(gl, gr)
            cross = bool(np.any(g == -2))
            m = m1.times(m2, cross=cross)
            if m.ind:
                m = IND_CROSS if cross else IND
            A.emit(ctx, out, m, Term(None) if cross else A.inexact(ctx, g))
    return [Poly(A._drop_zero(out), shape)]


def _matrix_monomial(ctx: Ctx, p: Poly):
    """``p = C * m(z)`` with one monomial shared by every entry of each matrix, or None.

    Returns ``(C, m, idx)`` where ``idx`` (batch shape, or None) is the element of z
    each matrix depends on.  Registry fact used for matrix factorisations:
    ``cholesky(C m) = cholesky(C) m^(1/2)`` and ``solve(C m, b) = solve(C, b) m^-1``.
    """
    nc = p.nonconst()
    const = p.terms.get(CONST)
    if len(nc) != 1 or (const is not None and (const.c is None or np.any(const.c != 0))):
        return None
    ((m, t),) = nc.items()
    if t.c is None or m.cross or m.ind:
        return None
    if ctx.scalar:
        return t.c, m, None
    nz = t.c != 0
    hi = np.max(np.where(nz, t.idx, -1), axis=(-2, -1))
    lo = np.min(np.where(nz, t.idx, np.iinfo(np.int64).max), axis=(-2, -1))
    if np.any((hi >= 0) & (hi != lo)):
        return None
    return t.c, m, hi


def _monomial_poly(ctx: Ctx, m: Mono, idx_batch, shape) -> Poly:
    """The value ``m(z)`` broadcast to a (batch..., r, c) array."""
    ones = np.ones(shape, ctx.cdtype)
    if idx_batch is None:
        return Poly({m: Term(ones)}, shape)
    idx = np.broadcast_to(idx_batch[..., None, None], shape)
    return Poly({m: Term(np.where(idx >= 0, ones, 0.0).astype(ctx.cdtype), idx)}, shape)


def _is_diagonal(p: Poly) -> bool:
    """Every term vanishes off the diagonal of the trailing two axes."""
    if len(p.shape) < 2 or p.shape[-1] != p.shape[-2]:
        return False
    off = ~np.eye(p.shape[-1], dtype=bool)
    for t in p.terms.values():
        if t.c is None or np.any(np.broadcast_to(t.c, p.shape)[..., off] != 0):
            return False
    return True


def _diagonal_solve(it, eqn, ins, shape):
    """triangular_solve with a diagonal, target-dependent matrix: divide by its diagonal."""
    ctx = it.ctx
    a = ins[0].abs
    b = it.arg(ins[1])
    if eqn.params.get("unit_diagonal", False):
        return b if isinstance(b, Poly) else np.asarray(b)
    n = a.shape[-1]
    dshape = a.shape[:-2] + ((n, 1) if eqn.params.get("left_side", False) else (1, n))

    def diag(x):
        return np.diagonal(np.asarray(x), axis1=-2, axis2=-1).reshape(dshape)

    d = A.broadcast(A.map_struct(a, diag, diag, dshape), shape)
    inv = A.power(ctx, d, -1.0)
    if inv is None:
        return it.new_opaque(eqn, ins)
    r = A.mul(ctx, b, inv, shape)
    return r if r is not None else _cross_opaque(it, eqn, ins)


@rule("cholesky")
def r_cholesky(it, eqn, ins):
    ctx = it.ctx
    shape = _aval_shape(eqn.outvars[0])
    if ctx.discrete:
        return discrete_rule(it, eqn, ins)
    mm = _matrix_monomial(ctx, ins[0].abs)
    if mm is None:
        if _is_diagonal(ins[0].abs):  # cholesky of a diagonal matrix: elementwise sqrt
            r = A.power(ctx, ins[0].abs, 0.5)
            return [r if r is not None else it.new_opaque(eqn, ins)]
        return [it.new_opaque(eqn, ins)]
    c, m, idx = mm
    half = A.power(ctx, _monomial_poly(ctx, m, idx, shape), 0.5)
    try:
        L = np.linalg.cholesky(np.asarray(c, dtype=np.float64))
    except np.linalg.LinAlgError:
        L = None
    if half is None or L is None or not np.all(np.isfinite(L)):
        return [it.new_opaque(eqn, ins)]
    return [A.scale(ctx, half, L.astype(ctx.cdtype))]


@rule("triangular_solve")
def r_triangular_solve(it, eqn, ins):
    ctx = it.ctx
    shape = _aval_shape(eqn.outvars[0])
    if ins[0].dep:
        if ctx.discrete:
            return discrete_rule(it, eqn, ins)
        mm = _matrix_monomial(ctx, ins[0].abs)
        if mm is None:
            if _is_diagonal(ins[0].abs):
                return [_diagonal_solve(it, eqn, ins, shape)]
            return [it.new_opaque(eqn, ins)]
        c, m, idx = mm
        inv = A.power(ctx, _monomial_poly(ctx, m, idx, shape[:-2] + (1, 1)), -1.0)
        if inv is None:
            return [it.new_opaque(eqn, ins)]
        a_const = np.asarray(c, dtype=eqn.invars[0].aval.dtype)
    else:
        inv, a_const = None, ins[0].const
    consts = {0: a_const}

    def f(c):
        return np.asarray(_bind_coef(eqn, 1, c, consts, ctx), dtype=ctx.cdtype)

    axis = len(shape) - 2 if eqn.params.get("left_side", False) else len(shape) - 1
    if ins[1].dep:
        x = A.linear(ctx, ins[1].abs, f, shape, grp_rule=_along_axis(axis, shape))
    else:
        x = np.asarray(f(np.asarray(ins[1].const)))
    if inv is None:
        return [x]
    r = A.mul(ctx, x, A.broadcast(inv, shape), shape)
    return [r if r is not None else _cross_opaque(it, eqn, ins)]


# -- guards -------------------------------------------------------------------------

PIECEWISE_CONST = (
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "is_finite",
    "sign",
    "floor",
    "ceil",
    "round",
    "and",
    "or",
    "not",
    "xor",
    "reduce_and",
    "reduce_or",
    "reduce_xor",
    "argmax",
    "argmin",
    "rem",
    "nextafter",
    "population_count",
    "clz",
    "shift_left",
    "shift_right_logical",
    "shift_right_arithmetic",
)


@rule(*PIECEWISE_CONST)
def r_piecewise_const(it, eqn, ins):
    """Piecewise-constant ops: constant if identical at every draw, else piecewise."""
    if it.ctx.discrete:
        return discrete_rule(it, eqn, ins)
    th = it.thunk(eqn, ins)
    per = th()
    outs = []
    for i in range(len(eqn.outvars)):
        vals = [np.asarray(p[i]) for p in per]
        r = it.resolve(vals)
        if r is None:
            outs.append(it.piecewise(eqn, ins))
        else:
            outs.append(Val(None, const=r))
    return outs


def _choose(it, eqn, ins, a: Val, b: Val, pick_a: list, shape):
    """Resolve a two-way choice (max/min): ``pick_a[d]`` per draw."""
    ctx = it.ctx
    p = it.resolve([np.broadcast_to(x, shape) for x in pick_a])
    if p is None:
        if A.polys_equal(ctx, it.arg(a), it.arg(b), rtol=1e-12):
            return it.arg(a)
        return it.piecewise(eqn, ins, what="the branch taken")
    res = A.select(ctx, p.astype(np.int32), [it.arg(b), it.arg(a)], shape)
    return res


@rule("max", "min")
def r_maxmin(it, eqn, ins):
    a, b = ins
    shape = _aval_shape(eqn.outvars[0])
    ca, cb = [a.at(d) for d in range(it.D)], [b.at(d) for d in range(it.D)]
    if eqn.primitive.name == "max":
        pick = [np.asarray(x >= y) for x, y in zip(ca, cb)]
    else:
        pick = [np.asarray(x <= y) for x, y in zip(ca, cb)]
    res = _choose(it, eqn, ins, a, b, pick, shape)
    if res is None:
        return [np.asarray(prim_bind(eqn, [a.const, b.const]))]
    return [res]


@rule("clamp")
def r_clamp(it, eqn, ins):
    lo, x, hi = ins
    ctx = it.ctx
    shape = _aval_shape(eqn.outvars[0])
    cx = [np.asarray(x.at(d)) for d in range(it.D)]
    clo = [np.asarray(lo.at(d)) for d in range(it.D)]
    chi = [np.asarray(hi.at(d)) for d in range(it.D)]
    above_lo = it.resolve([np.broadcast_to(u >= v, shape) for u, v in zip(cx, clo)])
    if above_lo is None:
        return [it.piecewise(eqn, ins, what="the branch taken")]
    t = A.select(ctx, above_lo.astype(np.int32), [it.arg(lo), it.arg(x)], shape)
    ct = [np.maximum(u, v) for u, v in zip(cx, clo)]
    below_hi = it.resolve([np.broadcast_to(u <= v, shape) for u, v in zip(ct, chi)])
    if below_hi is None:
        return [it.piecewise(eqn, ins, what="the branch taken")]
    if t is None:
        t = np.broadcast_to(np.clip(cx[0], clo[0], chi[0]), shape)
    res = A.select(ctx, below_hi.astype(np.int32), [it.arg(hi), t], shape)
    if res is None:
        return [np.asarray(prim_bind(eqn, [v.at(0) for v in ins]))]
    return [res]


@rule("abs")
def r_abs(it, eqn, ins):
    ctx = it.ctx
    x = ins[0]
    shape = _aval_shape(eqn.outvars[0])
    pos = it.resolve([np.asarray(v >= 0) for v in x.conc()])
    if pos is None:
        return [it.piecewise(eqn, ins, what="the sign")]
    return [A.select(ctx, pos.astype(np.int32), [A.neg(ctx, x.abs), x.abs], shape)]


@rule("select_n")
def r_select_n(it, eqn, ins):
    ctx = it.ctx
    pred, cases = ins[0], ins[1:]
    shape = _aval_shape(eqn.outvars[0])
    if pred.dep:
        if ctx.discrete:
            return discrete_rule(it, eqn, ins)
        if isinstance(pred.abs, Opaque):
            P = None
        else:
            P = it.resolve([np.asarray(p) for p in pred.conc()])
        if P is None:
            args = [it.arg(c) for c in cases]
            if all(A.polys_equal(ctx, args[0], a, rtol=1e-12) for a in args[1:]):
                return [args[0]]
            if isinstance(pred.abs, Opaque):
                return [it.propagate(eqn, [pred])]
            return [it.piecewise(eqn, ins, what="the branch taken")]
    else:
        P = np.asarray(pred.const)
    P = np.broadcast_to(P, shape)
    Pi = P.astype(np.int32)
    args = [it.arg(c) for c in cases]
    res = A.select(ctx, Pi, args, shape)
    if res is None:
        chosen = [np.broadcast_to(np.asarray(c.const), shape) if not c.dep else None for c in cases]
        fill = next(x for x in chosen if x is not None)
        chosen = [fill if x is None else x for x in chosen]
        return [np.choose(Pi, chosen)]
    return [res]


@rule("reduce_max", "reduce_min")
def r_reduce_maxmin(it, eqn, ins):
    axes = tuple(eqn.params["axes"])
    shape = _aval_shape(eqn.outvars[0])
    x = ins[0]
    nd = len(x.conc()[0].shape) if it.D else 0
    keep = [d for d in range(nd) if d not in axes]

    def flat(a):
        a = np.transpose(np.asarray(a), keep + list(axes))
        return a.reshape(a.shape[: len(keep)] + (-1,))

    fn = np.argmax if eqn.primitive.name == "reduce_max" else np.argmin
    args = [fn(flat(v), axis=-1) for v in x.conc()]
    arg = it.resolve(args)
    if arg is None:
        return [it.piecewise(eqn, ins, what="the position of the extremum")]

    def take(c):
        return np.take_along_axis(flat(c), arg[..., None], axis=-1)[..., 0].reshape(shape)

    return [A.map_struct(x.abs, take, take, shape)]


# -- calls ------------------------------------------------------------------------------


# Calls (jit, custom_jvp/vjp, remat, ...) are entered by the shared walker
# (autocvi.jaxpr.interpret) before a rule is looked up; `cond` is a rule because its
# branch depends on the (possibly target-dependent) index.


@rule("cond")
def r_cond(it, eqn, ins):
    branches = eqn.params["branches"]
    index, ops = ins[0], ins[1:]
    if index.dep:
        if it.ctx.discrete:
            return discrete_rule(it, eqn, ins)
        k = None if isinstance(index.abs, Opaque) else it.resolve(index.conc())
        if k is None:
            o = it.piecewise(eqn, ins, what="the branch taken")
            return [o] * len(eqn.outvars)
    else:
        k = index.const
    k = int(np.clip(np.asarray(k), 0, len(branches) - 1))
    jaxpr, consts = closed_parts(branches[k])
    return it.eval_jaxpr(jaxpr, consts, list(ops))


MAX_SCAN_UNROLL = 2000


def _slice_val(it: Interpreter, v: Val, i: int) -> Val:
    """``v[i]`` along the leading axis (a scanned-over input)."""
    if not v.dep:
        return Val(None, const=np.asarray(v.const)[i])
    a = v.abs
    if isinstance(a, Poly):

        def take(x):
            return np.asarray(x)[i]

        a = A.map_struct(a, take, take, a.shape[1:])
    return Val(a, thunk=lambda: [np.asarray(c)[i] for c in v.conc()])


def _stack_vals(it: Interpreter, vals: list, shape) -> Val:
    """Stack per-iteration outputs along a new leading axis (scan's ``ys``)."""
    ctx = it.ctx
    if not any(v.dep for v in vals):
        return Val(None, const=np.stack([np.asarray(v.const) for v in vals]))

    def thunk():
        return [np.stack([np.asarray(v.at(d)) for v in vals]) for d in range(it.D)]

    ops = [v.abs for v in vals if isinstance(v.abs, Opaque)]
    if ops:
        return Val(Opaque(ops[0].origin, ops[0].desc, any(o.piecewise for o in ops)), thunk=thunk)
    inner = tuple(shape[1:])
    polys = [v.abs if v.dep else A.const_poly(ctx, v.const, inner) for v in vals]
    monos = []
    for p in polys:
        for m in p.terms:
            if m not in monos:
                monos.append(m)
    terms = {}
    for m in monos:
        ts = [p.terms.get(m) for p in polys]
        if any(t is not None and t.c is None for t in ts):
            if ctx.scalar:
                terms[m] = Term(None)
                continue
            gs = [
                np.full(inner, -1, np.int64) if t is None else A.group_map(ctx, t, inner)
                for t in ts
            ]
            terms[m] = A.inexact(ctx, np.stack(gs))
            continue
        cs = [np.zeros(inner, ctx.cdtype) if t is None else np.broadcast_to(t.c, inner) for t in ts]
        c = np.stack(cs)
        if m == CONST or ctx.scalar:
            terms[m] = Term(c)
        else:
            ids = [
                np.full(inner, -1, np.int64) if t is None else np.broadcast_to(t.idx, inner)
                for t in ts
            ]
            terms[m] = Term(c, np.stack(ids))
    return Val(Poly(A._drop_zero(terms), tuple(shape)), thunk=thunk)


@rule("scan")
def r_scan(it, eqn, ins):
    """Unroll ``lax.scan`` (up to MAX_SCAN_UNROLL steps) through the interpreter."""
    p = eqn.params
    length, nc, ncar = int(p["length"]), int(p["num_consts"]), int(p["num_carry"])
    if length > MAX_SCAN_UNROLL:
        msg = f"`scan` of length {length} (longer than {MAX_SCAN_UNROLL}) carries the target"
        o = it.new_opaque(eqn, ins, message=msg)
        return [o] * len(eqn.outvars)
    body, bconsts = closed_parts(p["jaxpr"])
    consts, carry, xs = list(ins[:nc]), list(ins[nc : nc + ncar]), list(ins[nc + ncar :])
    order = range(length - 1, -1, -1) if p.get("reverse", False) else range(length)
    ys = {}
    for i in order:
        outs = it.eval_jaxpr(body, bconsts, consts + carry + [_slice_val(it, x, i) for x in xs])
        carry, ys[i] = list(outs[:ncar]), outs[ncar:]
    stacked = []
    for k, var in enumerate(eqn.outvars[ncar:]):
        stacked.append(_stack_vals(it, [ys[i][k] for i in range(length)], _aval_shape(var)))
    return carry + stacked


@rule("optimization_barrier")
def r_barrier(it, eqn, ins):
    return list(ins)


# Rules that run even when no input depends on the target (a constant-index `cond`
# is evaluated through its branch, in numpy, instead of compiling the cond).
RULED_WHEN_CONSTANT = frozenset({"cond"})

# -- discrete targets ---------------------------------------------------------------

ELEMENTWISE = frozenset(
    """abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp cos cosh
    convert_element_type digamma div eq erf erf_inv erfc exp exp2 expm1 floor ge gt igamma
    igammac imag integer_pow is_finite le lgamma log log1p logistic lt max min mul ne neg
    nextafter not or polygamma population_count pow real reduce_precision rem round rsqrt
    select_n sign sin sinh sqrt square sub tan tanh xor zeta bessel_i0e bessel_i1e
    random_gamma_grad copy copy_p stop_gradient shift_left shift_right_logical
    shift_right_arithmetic clz""".split()
)

# primitives whose general rules are exact for indicator terms too
DISCRETE_SAFE = frozenset(
    set(STRUCT_NAMES)
    | {
        "convert_element_type",
        "add",
        "add_any",
        "sub",
        "neg",
        "mul",
        "div",
        "reduce_sum",
        "cumsum",
        "dot_general",
        "triangular_solve",
        "cholesky",
        "concatenate",
        "stack",
        "pad",
        "gather",
        "dynamic_slice",
        "dynamic_update_slice",
        "scatter",
        "scatter-add",
        "scatter_add",
        "split",
        "select_n",
        "cond",
        "optimization_barrier",
        "scan",
    }
)

OPAQUE_AWARE = frozenset(
    {
        "select_n",
        "optimization_barrier",
        "scan",
    }
)

LINEAR_NAMES = frozenset(
    set(STRUCT_NAMES)
    | {
        "convert_element_type",
        "add",
        "add_any",
        "sub",
        "neg",
        "mul",
        "div",
        "reduce_sum",
        "concatenate",
        "stack",
        "pad",
        "gather",
        "dynamic_slice",
        "dynamic_update_slice",
        "select_n",
        "dot_general",
        "cumsum",
        "triangular_solve",
        "max",
        "min",
        "clamp",
    }
)


def _dependence(it, shape, polys):
    """(mask, idx, pure) of 'which element of z each output element depends on'."""
    ctx = it.ctx
    mask = np.zeros(shape, bool)
    idx = None if ctx.scalar else np.full(shape, -1, np.int64)
    pure = True
    for p in polys:
        p = A.broadcast(p, shape)
        for m, t in p.nonconst().items():
            if m.cross:
                pure = False
                continue
            if idx is None:
                mask |= True if t.c is None else (t.c != 0)
                continue
            g = A.group_map(ctx, t, shape)
            act = g != -1
            mask |= act
            if np.any(g == -2) or np.any(act & (idx >= 0) & (idx != g)):
                pure = False
            idx = np.where(idx >= 0, idx, np.where(act, g, -1))
    return mask, idx, pure


def discrete_rule(it: Interpreter, eqn, ins):
    """Any function of a discrete target is a function of its indicator."""
    ctx = it.ctx
    if any(isinstance(v.abs, Opaque) for v in ins):
        return [it.propagate(eqn, ins)] * len(eqn.outvars)
    name = eqn.primitive.name
    shapes = [_aval_shape(v) for v in eqn.outvars]
    if ctx.scalar:
        return [Poly({IND: Term(np.ones(s, ctx.cdtype))}, s) for s in shapes]
    if name in ELEMENTWISE and len(shapes) == 1:
        shape = shapes[0]
        mask, idx, pure = _dependence(it, shape, [v.abs for v in ins if v.dep])
        if pure:
            return [Poly(A._drop_zero({IND: Term(mask.astype(ctx.cdtype), idx)}), shape)]
        return [Poly({IND_CROSS: Term(None)}, shape)]
    if name == "gather" and ins[1].dep and not ins[0].dep:
        shape = shapes[0]
        ishape = _aval_shape(eqn.invars[1])
        mask, idx, pure = _dependence(it, ishape, [ins[1].abs])
        if pure and len(ishape) >= 1:
            last_idx = idx[..., :1]
            same = np.all((idx == last_idx) | (idx < 0))
            if same:
                dn = eqn.params["dimension_numbers"]
                batch = [d for d in range(len(shape)) if d not in dn.offset_dims]
                idx_b = np.max(idx, axis=-1)
                mask_b = np.any(mask, axis=-1)
                if len(batch) == idx_b.ndim:
                    idx_o = _np_broadcast_in_dim(idx_b, shape, batch)
                    mask_o = _np_broadcast_in_dim(mask_b, shape, batch)
                    return [Poly({IND: Term(mask_o.astype(ctx.cdtype), idx_o)}, shape)]
    return [Poly({IND_CROSS: Term(None)}, s) for s in shapes]
