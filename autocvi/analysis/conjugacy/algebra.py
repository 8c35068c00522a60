"""Polynomials in the sufficient-statistic atoms of one latent (the *target*).

The abstract value of an intermediate array ``x`` of a factor's log density is

* ``None`` (CONST): ``x`` does not depend on the target; its concrete value is
  carried next to it by the interpreter;
* a :class:`Poly`: ``x = sum_m c_m * m(z)`` where each monomial ``m`` is a
  product of atoms of the target ``z`` -- ``z^a``, ``(1-z)^b``, ``(log z)^k``,
  ``(log(1-z))^l`` or ``indicator(z)`` (any function of a discrete ``z``);
* an :class:`Opaque`: not such a polynomial; it records the first operation
  that broke the structure (its :class:`Origin`) for the explanation.

Coefficients are numeric arrays of ``x``'s shape.  For a non-scalar target each
exact coefficient comes with an *index map* ``idx`` (same shape, flat index of
the element of ``z`` the monomial is evaluated at), so ``x[i] = sum_m
c_m[i] * m(z[idx_m[i]])``.  A coefficient ``None`` means "known to be a sum of
several such products over different elements of z, coefficients not tracked"
(after a reduction or a matrix product that mixes elements).  Products of
factors that live on *different* elements of ``z`` are flagged ``cross`` in
their monomial (``z_j z_k``); they matter for elementwise families.

All functions here are pure; failures return ``None`` and the interpreter turns
them into an :class:`Opaque` naming the primitive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CONST",
    "Ctx",
    "Mono",
    "Opaque",
    "Origin",
    "Poly",
    "Term",
    "describe",
    "mono_name",
]

MAX_EXPAND = 8  # largest integer power expanded by multiplication
MAX_PIECES = 32  # largest number of distinct exponents handled elementwise
# Largest number of monomials a product keeps. A conjugate factor has a handful (a
# Normal's z and z^2, a Gamma's z and log z); a product of products can double its
# degree at every step: a discrete-time SIR model in ``lax.scan`` (beta * S * I with S
# and I polynomials in beta) reached degree 2^t after t days, and tracing it took 38 s
# at 16 days and hours at 30. Past this many terms the value is not representable (an
# Opaque naming the product): the edge is classified non-conjugate, with that reason.
MAX_TERMS = 64


def _pw(x) -> float:
    """Normalise a power (float noise, -0.0)."""
    r = round(float(x), 9)
    return r + 0.0


def _is_int(x) -> bool:
    return float(x).is_integer()


def _fmt(p: float) -> str:
    return str(int(p)) if _is_int(p) else f"{p:g}"


@dataclass(frozen=True)
class Mono:
    """A product of atoms of the target: z^zp (1-z)^wp (log z)^lz (log(1-z))^lw [indicator(z)].

    ``cross`` marks products whose factors are evaluated at different elements
    of a non-scalar target (e.g. ``z_j z_k``); then the powers are total degrees.
    """

    zp: float = 0.0
    wp: float = 0.0
    lz: int = 0
    lw: int = 0
    ind: bool = False
    cross: bool = False

    def is_polynomial(self) -> bool:
        """A non-negative integer power of z and nothing else (z^0 included)."""
        return (
            self.zp >= 0
            and _is_int(self.zp)
            and self.wp == 0
            and self.lz == 0
            and self.lw == 0
            and not self.ind
        )

    def has_log(self) -> bool:
        return self.lz != 0 or self.lw != 0

    def times(self, other: Mono, cross: bool = False) -> Mono:
        return Mono(
            _pw(self.zp + other.zp),
            _pw(self.wp + other.wp),
            self.lz + other.lz,
            self.lw + other.lw,
            self.ind or other.ind,
            cross or self.cross or other.cross,
        )

    def power(self, q: float) -> Mono:
        return Mono(
            _pw(self.zp * q),
            _pw(self.wp * q),
            int(round(self.lz * q)),
            int(round(self.lw * q)),
            self.ind,
            self.cross,
        )


CONST = Mono()
LOGZ = Mono(lz=1)
LOGW = Mono(lw=1)
IND = Mono(ind=True)
IND_CROSS = Mono(ind=True, cross=True)


@dataclass
class Term:
    """Coefficients of one monomial.

    * exact: ``c`` (array) and, for non-scalar targets, ``idx`` (element map);
    * inexact (``c is None``): a sum of several products whose coefficients are
      not tracked; ``grp`` maps each entry to the *group* of z (one element, or one
      event row of a MultivariateNormal) all its products live on: -1 no
      contribution, -2 several groups; ``grp=None`` means unknown (several).
    """

    c: np.ndarray | None
    idx: np.ndarray | None = None
    grp: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class Origin:
    """Where the structure broke: the primitive and a phrase describing it."""

    prim: str
    message: str  # e.g. "`exp` is applied to an expression linear in w"
    source: str = ""  # user source line, when known
    piecewise: bool = False
    kind: str = "opaque"  # "opaque" | "piecewise" | "cross"


@dataclass(eq=False)
class Opaque:
    """A value that is not a polynomial in the target's statistic atoms."""

    origin: Origin
    desc: str  # short description of this value, e.g. "exp(linear in w)"
    piecewise: bool = False


@dataclass
class Ctx:
    """What the analysis knows about the target."""

    name: str  # the target's site name, for printing
    family: str
    discrete: bool  # Categorical / Bernoulli: every function of z is affine in indicator(z)
    scalar: bool  # target has a single element: no index maps needed
    positive: bool  # z > 0 on the support
    unit: bool  # 1 - z > 0 on the support
    cdtype: type = np.float64  # dtype of coefficient arrays
    group: int = 1  # elements per group: event size of a (batched) MultivariateNormal, else 1

    @property
    def tol(self) -> float:
        return 32.0 * float(np.finfo(self.cdtype).eps)


class Poly:
    """``x = sum_m terms[m].c * m(z)``; all arrays have ``shape``."""

    __slots__ = ("terms", "shape")

    def __init__(self, terms: dict[Mono, Term], shape: tuple):
        self.terms = terms
        self.shape = tuple(shape)

    def __repr__(self):  # pragma: no cover - debugging aid
        return f"Poly({ {mono_name(m, 'z'): (None if t.c is None else t.c.shape) for m, t in self.terms.items()} }, shape={self.shape})"

    def nonconst(self):
        return {m: t for m, t in self.terms.items() if m != CONST}

    def exact(self) -> bool:
        return all(t.c is not None for t in self.terms.values())


# ---------------------------------------------------------------------------
# construction and small helpers
# ---------------------------------------------------------------------------


def const_poly(ctx: Ctx, value, shape) -> Poly:
    c = np.broadcast_to(np.asarray(value, dtype=ctx.cdtype), shape)
    return Poly({CONST: Term(c)}, shape)


def as_poly(ctx: Ctx, a, shape) -> Poly:
    """CONST array or Poly -> Poly broadcast to ``shape``."""
    if isinstance(a, Poly):
        return broadcast(a, shape)
    return const_poly(ctx, a, shape)


def broadcast(p: Poly, shape) -> Poly:
    shape = tuple(shape)
    if p.shape == shape:
        return p
    terms = {}
    for m, t in p.terms.items():
        c = None if t.c is None else np.broadcast_to(t.c, shape)
        idx = None if t.idx is None else np.broadcast_to(t.idx, shape)
        # the group map too: dropping it read an implicit broadcast (add of a (1, N)
        # predictor and an (n, N) constant) as coupling several rows
        grp = None if t.grp is None else np.broadcast_to(t.grp, shape)
        terms[m] = Term(c, idx, grp)
    return Poly(terms, shape)


def _drop_zero(terms: dict[Mono, Term]) -> dict[Mono, Term]:
    return {m: t for m, t in terms.items() if t.c is None or np.any(t.c != 0)}


def _cancel(c, a, b, tol):
    """Set to zero the entries of ``c = a + b`` that vanish up to rounding."""
    with np.errstate(invalid="ignore"):
        small = np.abs(c) <= tol * (np.abs(a) + np.abs(b))
    if np.any(small):
        c = np.where(small, 0.0, c).astype(c.dtype)
    return c


def group_map(ctx: Ctx, t: Term, shape) -> np.ndarray | None:
    """Group of z each entry of a term lives on (-1: none, -2: several); None for scalar z."""
    if ctx.scalar:
        return None
    if t.c is not None:
        if t.idx is None:  # the constant monomial
            return np.full(shape, -1, np.int64)
        return np.where(t.c != 0, np.broadcast_to(t.idx, shape) // ctx.group, -1)
    if t.grp is None:
        return np.full(shape, -2, np.int64)
    return np.broadcast_to(t.grp, shape)


def merge_groups(g1, g2):
    """Groups of a sum."""
    return np.where(g1 == -1, g2, np.where((g2 == -1) | (g1 == g2), g1, -2))


def product_groups(g1, g2):
    """Groups of a product; entries with -2 combine several groups (a cross product)."""
    active = (g1 != -1) & (g2 != -1)
    return np.where(~active, -1, np.where((g1 == g2) & (g1 >= 0), g1, -2))


def _shape_of(*ts):
    for t in ts:
        for a in (t.c, t.idx, t.grp):
            if a is not None:
                return np.shape(a)
    return None


def inexact(ctx: Ctx, grp) -> Term:
    return Term(None, None, None if ctx.scalar else grp)


def _add_term(ctx: Ctx, m: Mono, t1: Term, t2: Term) -> Term:
    if t1.c is None or t2.c is None:
        shape = _shape_of(t1, t2)
        if ctx.scalar or shape is None:
            return Term(None)
        return inexact(ctx, merge_groups(group_map(ctx, t1, shape), group_map(ctx, t2, shape)))
    with np.errstate(invalid="ignore"):
        c = _cancel(t1.c + t2.c, t1.c, t2.c, ctx.tol)
    if m == CONST or ctx.scalar:
        return Term(c)
    nz1 = t1.c != 0
    nz2 = t2.c != 0
    if np.any(nz1 & nz2 & (t1.idx != t2.idx)):  # a sum over different elements
        shape = np.shape(c)
        return inexact(ctx, merge_groups(group_map(ctx, t1, shape), group_map(ctx, t2, shape)))
    return Term(c, np.where(nz1, t1.idx, t2.idx))


def _accumulate(ctx: Ctx, out: dict[Mono, Term], m: Mono, t: Term):
    if m in out:
        out[m] = _add_term(ctx, m, out[m], t)
    else:
        out[m] = t


def emit(ctx: Ctx, out: dict[Mono, Term], m: Mono, t: Term):
    """Add ``t * m`` to ``out``, expanding non-negative integer powers of (1-z)."""
    if m.wp > 0 and _is_int(m.wp) and m.wp <= MAX_EXPAND and not ctx.discrete:
        k = int(m.wp)
        for j in range(k + 1):
            coef = math.comb(k, j) * (-1) ** j
            mj = Mono(_pw(m.zp + j), 0.0, m.lz, m.lw, m.ind, m.cross)
            tj = Term(None if t.c is None else (t.c * coef).astype(t.c.dtype), t.idx, t.grp)
            _accumulate(ctx, out, mj, tj)
    else:
        _accumulate(ctx, out, m, t)


def add(ctx: Ctx, a, b, shape) -> Poly:
    pa, pb = as_poly(ctx, a, shape), as_poly(ctx, b, shape)
    out = dict(pa.terms)
    for m, t in pb.terms.items():
        _accumulate(ctx, out, m, t)
    return Poly(_drop_zero(out), shape)


def scale(ctx: Ctx, p: Poly, s) -> Poly:
    """Multiply by a CONST array (broadcastable to ``p.shape``)."""
    s = np.asarray(s, dtype=ctx.cdtype)
    terms = {}
    for m, t in p.terms.items():
        if t.c is None:
            terms[m] = t if np.any(s != 0) else Term(np.zeros(p.shape, ctx.cdtype))
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                c = np.where((t.c == 0) | (s == 0), 0.0, t.c * s).astype(ctx.cdtype)
            terms[m] = Term(np.broadcast_to(c, p.shape), t.idx)
    return Poly(_drop_zero(terms), p.shape)


def neg(ctx: Ctx, p: Poly) -> Poly:
    return scale(ctx, p, -1.0)


def _same_element(ctx: Ctx, t1: Term, t2: Term) -> bool:
    if ctx.scalar:
        return True
    if t1.c is None or t2.c is None:
        return False
    nz = (t1.c != 0) & (t2.c != 0)
    return not np.any(nz & (t1.idx != t2.idx))


def mul(ctx: Ctx, a, b, shape) -> Poly | None:
    """Product of two values (CONST arrays or Polys).  ``None``: not representable."""
    if not isinstance(a, Poly):
        return scale(ctx, broadcast(b, shape), a)
    if not isinstance(b, Poly):
        return scale(ctx, broadcast(a, shape), b)
    pa, pb = broadcast(a, shape), broadcast(b, shape)
    if product_size(pa, pb) > MAX_TERMS:
        return None
    out: dict[Mono, Term] = {}
    for m1, t1 in pa.terms.items():
        for m2, t2 in pb.terms.items():
            if m1 == CONST or m2 == CONST or _same_element(ctx, t1, t2):
                if t1.c is None or t2.c is None:  # (a sum) x (a constant): same groups
                    m = m1.times(m2)
                    t = t1 if t1.c is None else t2
                    emit(ctx, out, m, Term(None, None, t.grp))
                    continue
                m = m1.times(m2)
                if m1.ind and m2.ind:
                    m = Mono(ind=True, cross=m.cross)
                with np.errstate(invalid="ignore", over="ignore"):
                    c = np.where((t1.c == 0) | (t2.c == 0), 0.0, t1.c * t2.c).astype(ctx.cdtype)
                if m == CONST or ctx.scalar:
                    idx = None
                elif m1 == CONST:
                    idx = t2.idx
                elif m2 == CONST:
                    idx = t1.idx
                else:
                    idx = np.where(t1.c != 0, t1.idx, t2.idx)
                emit(ctx, out, m, Term(c, idx))
                continue
            # products of different elements of z: exact coefficients are lost
            if not ctx.discrete and not (m1.is_polynomial() and m2.is_polynomial()):
                return None
            g = product_groups(group_map(ctx, t1, shape), group_map(ctx, t2, shape))
            cross = bool(np.any(g == -2))
            m = m1.times(m2, cross=cross)
            if m.ind:
                m = Mono(ind=True, cross=m.cross)
            emit(ctx, out, m, Term(None) if cross else inexact(ctx, g))
    return Poly(_drop_zero(out), shape)


def product_size(a, b) -> int:
    """How many monomials ``a * b`` has (before any cancel), for two Polys; 0 otherwise.
    Past ``MAX_TERMS**2`` pairs it says so without forming them."""
    if not (isinstance(a, Poly) and isinstance(b, Poly)):
        return 0
    if len(a.terms) * len(b.terms) > MAX_TERMS**2:
        return MAX_TERMS**2
    return len({m1.times(m2) for m1 in a.terms for m2 in b.terms})


def select(ctx: Ctx, pred: np.ndarray, cases: list, shape):
    """``select_n`` with a CONST predicate; cases are CONST arrays, Polys or Opaques."""
    pred = np.broadcast_to(np.asarray(pred), shape)
    if pred.dtype == bool:
        pred = pred.astype(np.int32)
    chosen = [k for k in range(len(cases)) if np.any(pred == k)]
    if len(chosen) == 1:
        a = cases[chosen[0]]
        if isinstance(a, Opaque):
            return a
        if isinstance(a, Poly):
            return broadcast(a, shape)
        return np.broadcast_to(np.asarray(a), shape)
    for k in chosen:
        if isinstance(cases[k], Opaque):
            return cases[k]
    if all(not isinstance(cases[k], Poly) for k in chosen):
        return None  # all constant: caller evaluates concretely
    out: dict[Mono, Term] = {}
    for k in chosen:
        mask = pred == k
        p = as_poly(ctx, cases[k], shape)
        for m, t in p.terms.items():
            if t.c is None:
                g = group_map(ctx, t, shape)
                _accumulate(ctx, out, m, inexact(ctx, None if g is None else np.where(mask, g, -1)))
                continue
            c = np.where(mask, t.c, 0.0).astype(ctx.cdtype)
            idx = None if t.idx is None else np.where(mask, t.idx, -1)
            _accumulate(ctx, out, m, Term(c, idx))
    return Poly(_drop_zero(out), shape)


def map_struct(p: Poly, fc, fi, shape) -> Poly:
    """Apply a structural op (reshape, slice, gather with constant indices...) termwise.

    ``fc`` maps coefficient arrays (pad/fill value 0), ``fi`` index maps (fill -1).
    """
    terms = {}
    for m, t in p.terms.items():
        c = None if t.c is None else np.asarray(fc(t.c))
        idx = None if (t.idx is None or t.c is None) else np.asarray(fi(t.idx))
        grp = None if (t.c is not None or t.grp is None) else np.asarray(fi(t.grp))
        terms[m] = Term(c, idx, grp)
    return Poly(_drop_zero(terms), shape)


def linear(ctx: Ctx, p: Poly, f, shape, idx_rule=None, grp_rule=None) -> Poly:
    """Apply a linear map that may mix elements (reduce_sum, dot_general with a constant...).

    ``idx_rule(term) -> idx or None`` decides whether an exact term stays
    single-element (non-scalar targets); otherwise the term becomes inexact and
    ``grp_rule(group_map) -> group_map`` follows its groups (unknown without it).
    """
    terms = {}
    for m, t in p.terms.items():
        if t.c is not None and (m == CONST or ctx.scalar):
            terms[m] = Term(np.asarray(f(t.c), dtype=ctx.cdtype))
            continue
        if t.c is not None and idx_rule is not None:
            idx = idx_rule(t)
            if idx is not None:
                terms[m] = Term(np.asarray(f(t.c), dtype=ctx.cdtype), idx)
                continue
        if ctx.scalar or grp_rule is None or (t.c is None and t.grp is None):
            terms[m] = Term(None)
        else:
            src = t.c if t.c is not None else t.grp
            terms[m] = inexact(ctx, grp_rule(group_map(ctx, t, np.shape(src))))
    return Poly(_drop_zero(terms), shape)


def reduce_groups(g, axes: tuple):
    """Groups after summing over ``axes``."""
    multi = np.any(g == -2, axis=axes)
    big = np.iinfo(np.int64).max
    hi = np.max(np.where(g >= 0, g, -1), axis=axes)
    lo = np.min(np.where(g >= 0, g, big), axis=axes)
    return np.where(multi | ((hi >= 0) & (hi != lo)), -2, hi)


def reduce_idx(t: Term, axes: tuple) -> np.ndarray | None:
    """Index map after summing over ``axes`` if each output sums a single element, else None."""
    nz = t.c != 0
    big = np.iinfo(np.int64).max
    hi = np.max(np.where(nz, t.idx, -1), axis=axes)
    lo = np.min(np.where(nz, t.idx, big), axis=axes)
    ok = (hi == lo) | (hi == -1)
    if not np.all(ok):
        return None
    return hi


def polys_equal(ctx: Ctx, a, b, rtol: float) -> bool:
    """Structural + numerical equality of two abstract values (for piecewise checks)."""
    if isinstance(a, Opaque) or isinstance(b, Opaque):
        return False
    if not isinstance(a, Poly) or not isinstance(b, Poly):
        if isinstance(a, Poly) or isinstance(b, Poly):
            return False
        return bool(np.all((np.asarray(a) == np.asarray(b)) | np.isclose(a, b, rtol=rtol)))
    if set(a.terms) != set(b.terms):
        return False
    for m, ta in a.terms.items():
        tb = b.terms[m]
        if ta.c is None or tb.c is None:
            return False  # untracked coefficients cannot be compared
        with np.errstate(invalid="ignore"):
            same = (ta.c == tb.c) | np.isclose(ta.c, tb.c, rtol=rtol, atol=0.0)
        if not np.all(same):
            return False
        if ta.idx is not None and tb.idx is not None:
            nz = ta.c != 0
            if np.any(nz & (ta.idx != tb.idx)):
                return False
    return True


# ---------------------------------------------------------------------------
# nonlinear rules: factorisation, log, exp, powers
# ---------------------------------------------------------------------------


def _binom_expand_w_to_z(j: int):
    """(1-z)^j = sum_r coef_r z^r."""
    return [(r, math.comb(j, r) * (-1) ** r) for r in range(j + 1)]


def factor(ctx: Ctx, p: Poly):
    """Write each element of ``p`` as a single term ``c * m(z)``.

    Returns a list of pieces ``(mask, c, mono, idx)`` covering all elements, or
    None.  Sums of powers of z and (1-z) are re-expanded in both bases, so that
    ``1 - z``, ``z/(1-z) + 1`` or ``1 + (1-z)/z`` are recognised as single terms.
    """
    shape = p.shape
    items = list(p.terms.items())
    if any(t.c is None for _, t in items):
        return None
    if not items:
        return [(np.ones(shape, bool), np.zeros(shape, ctx.cdtype), CONST, None)]
    nz = [t.c != 0 for _, t in items]
    count = np.sum(np.stack(nz), axis=0) if len(nz) > 1 else nz[0].astype(int)
    pieces = []
    zero = count == 0
    if np.any(zero):
        pieces.append((zero, np.zeros(shape, ctx.cdtype), CONST, None))
    single = count == 1
    for (m, t), n in zip(items, nz):
        mask = n & single
        if np.any(mask):
            pieces.append((mask, t.c, m, t.idx))
    multi = count >= 2
    if not np.any(multi):
        return pieces
    # elements that are sums of several terms: only z^a (1-z)^b monomials can combine
    for (m, _t), n in zip(items, nz):
        if np.any(n & multi) and (m.has_log() or m.ind or m.cross):
            return None
    idx = None
    if not ctx.scalar:
        ref = None
        for (m, t), n in zip(items, nz):
            if m == CONST or t.idx is None:
                continue
            sel = n & multi
            cur = np.where(sel, t.idx, -1)
            if ref is None:
                ref = cur
            else:
                if np.any((ref >= 0) & (cur >= 0) & (ref != cur)):
                    return None
                ref = np.where(ref >= 0, ref, cur)
        idx = ref
    # group the elements by which terms are nonzero there (few patterns)
    codes = np.zeros(shape, np.int64)
    for k, n in enumerate(nz):
        codes = codes | (n.astype(np.int64) << k)
    flat = codes[multi]
    ucodes = [flat[0]] if np.all(flat == flat[0]) else np.unique(flat)
    keyed: dict[tuple, list] = {}
    for code in ucodes:
        members = [k for k in range(len(items)) if (int(code) >> k) & 1]
        key = (min(items[k][0].zp for k in members), min(items[k][0].wp for k in members))
        keyed.setdefault(key, []).append(code)
    if len(keyed) > MAX_PIECES:
        return None
    uniq = list(keyed)
    for key, cs in keyed.items():
        sel = np.zeros(shape, bool)
        for code in cs:
            sel |= codes == code
        keyed[key] = multi & sel
    for a, b in uniq:
        grp = keyed[(a, b)]
        # coefficients of z^d, d = 0..deg, after expanding (1-z)^j
        zc: dict[int, np.ndarray] = {}
        scale_ = np.zeros(shape, ctx.cdtype)
        for (m, t), n in zip(items, nz):
            sel = n & grp
            if not np.any(sel):
                continue
            i, j = m.zp - a, m.wp - b
            if i < 0 or j < 0 or not _is_int(i) or not _is_int(j) or i + j > MAX_EXPAND:
                return None
            c = np.where(sel, t.c, 0.0)
            scale_ = scale_ + np.abs(c)
            for r, coef in _binom_expand_w_to_z(int(j)):
                d = int(i) + r
                zc[d] = zc.get(d, 0.0) + c * coef
        tol = ctx.tol * 4 * scale_
        zc = {d: np.where(np.abs(v) <= tol, 0.0, v) for d, v in zc.items()}
        nzd = {d: v != 0 for d, v in zc.items()}
        ndeg = sum(v.astype(int) for v in nzd.values())
        done = grp & (ndeg <= 1)
        for d, v in zc.items():
            mask = done & nzd[d]
            if np.any(mask):
                pieces.append((mask, v, Mono(_pw(a + d), _pw(b)), idx))
        zmask = done & (ndeg == 0)
        if np.any(zmask):
            pieces.append((zmask, np.zeros(shape, ctx.cdtype), CONST, None))
        rest = grp & (ndeg >= 2)
        if not np.any(rest):
            continue
        # try the (1-z) basis: z^d = (1-w)^d
        wc: dict[int, np.ndarray] = {}
        for d, v in zc.items():
            for s, coef in _binom_expand_w_to_z(d):
                wc[s] = wc.get(s, 0.0) + np.where(rest, v, 0.0) * coef
        wc = {s: np.where(np.abs(v) <= tol, 0.0, v) for s, v in wc.items()}
        nws = sum((v != 0).astype(int) for v in wc.values())
        if np.any(rest & (nws != 1)):
            return None
        for s, v in wc.items():
            mask = rest & (v != 0)
            if np.any(mask):
                pieces.append((mask, v, Mono(_pw(a), _pw(b + s)), idx))
    return pieces


def _atoms_positive(ctx: Ctx, m: Mono) -> bool:
    if m.zp != 0 and not ctx.positive:
        return False
    if m.wp != 0 and not ctx.unit:
        return False
    return True


def log(ctx: Ctx, p: Poly) -> Poly | None:
    """log of a value that is elementwise a single positive term ``c z^a (1-z)^b``."""
    pieces = factor(ctx, p)
    if pieces is None:
        return None
    shape = p.shape
    out: dict[Mono, Term] = {}
    for mask, c, m, idx in pieces:
        if m.has_log() or m.ind or m.cross or not _atoms_positive(ctx, m):
            return None
        cm = np.where(mask, c, 1.0)
        if np.any(cm < 0) or np.any(np.isnan(cm)):
            return None
        with np.errstate(divide="ignore"):
            lc = np.where(mask, np.log(cm), 0.0).astype(ctx.cdtype)
        _accumulate(ctx, out, CONST, Term(lc))
        if m.zp != 0:
            _accumulate(ctx, out, LOGZ, Term(np.where(mask, m.zp, 0.0).astype(ctx.cdtype), idx))
        if m.wp != 0:
            _accumulate(ctx, out, LOGW, Term(np.where(mask, m.wp, 0.0).astype(ctx.cdtype), idx))
    return Poly(_drop_zero(out), shape)


def exp(ctx: Ctx, p: Poly) -> Poly | None:
    """exp(b + a log z + a' log(1-z)) = e^b z^a (1-z)^a'."""
    shape = p.shape
    b = np.zeros(shape, ctx.cdtype)
    a = np.zeros(shape)
    w = np.zeros(shape)
    idxs = []
    for m, t in p.terms.items():
        if t.c is None:
            return None
        if m == CONST:
            b = t.c
        elif m == LOGZ:
            a = t.c
            idxs.append((t.c, t.idx))
        elif m == LOGW:
            w = t.c
            idxs.append((t.c, t.idx))
        else:
            return None
    idx = None
    if not ctx.scalar and idxs:
        if len(idxs) == 2:
            (c1, i1), (c2, i2) = idxs
            if np.any((c1 != 0) & (c2 != 0) & (i1 != i2)):
                return None
            idx = np.where(c1 != 0, i1, i2)
        else:
            idx = idxs[0][1]
    ka_arr = np.round(np.asarray(a, float), 9)
    kw_arr = np.round(np.asarray(w, float), 9)
    ua = [ka_arr.flat[0]] if np.all(ka_arr == ka_arr.flat[0]) else np.unique(ka_arr)
    uw = [kw_arr.flat[0]] if np.all(kw_arr == kw_arr.flat[0]) else np.unique(kw_arr)
    if len(ua) * len(uw) > MAX_PIECES:
        return None
    uniq = [(x, y) for x in ua for y in uw]
    with np.errstate(over="ignore"):
        eb = np.exp(b).astype(ctx.cdtype)
    out: dict[Mono, Term] = {}
    for ka, kw in uniq:
        mask = (ka_arr == ka) & (kw_arr == kw)
        if not np.any(mask):
            continue
        m = Mono(_pw(ka), _pw(kw))
        emit(
            ctx,
            out,
            m,
            Term(np.where(mask, eb, 0.0).astype(ctx.cdtype), None if m == CONST else idx),
        )
    return Poly(_drop_zero(out), shape)


def power(ctx: Ctx, p: Poly, q) -> Poly | None:
    """``p ** q`` for a CONST exponent ``q`` (scalar or array)."""
    shape = p.shape
    q = np.broadcast_to(np.asarray(q, dtype=float), shape)
    qs = np.unique(q)
    if len(qs) > MAX_PIECES:
        return None
    pieces = factor(ctx, p)
    if len(qs) == 1:
        q0 = float(qs[0])
        if q0 == 0:
            return const_poly(ctx, 1.0, shape)
        if q0 == 1:
            return p
        if pieces is None and _is_int(q0) and 1 < q0 <= MAX_EXPAND:
            # a sum that is not a single term: expand the integer power
            acc = p
            for _ in range(int(q0) - 1):
                acc = mul(ctx, acc, p, shape)
                if acc is None:
                    return None
            return acc
    if pieces is None:
        return None
    out: dict[Mono, Term] = {}
    for mask, c, m, idx in pieces:
        for qv in np.unique(q[mask]):
            qv = float(qv)
            sel = mask & (q == qv)
            if m.ind or m.cross:
                return None
            cm = np.where(sel, c, 1.0)
            if not _is_int(qv):
                if m.has_log() or not _atoms_positive(ctx, m) or np.any(cm < 0):
                    return None
            elif qv < 0 and m.has_log():
                return None
            with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
                cq = np.where(sel, np.power(cm, qv), 0.0).astype(ctx.cdtype)
            mq = m.power(qv)
            emit(ctx, out, mq, Term(cq, None if mq == CONST else idx))
    return Poly(_drop_zero(out), shape)


# ---------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------


def mono_name(m: Mono, s: str, family: str | None = None) -> str:
    """Pretty, sympy-free name of a monomial with the target called ``s``."""
    if m == CONST:
        return "1"
    if m.cross and m.is_polynomial() and m.zp == 2:
        return f"{s}_j {s}_k"
    if family == "MultivariateNormal" and m == Mono(zp=2.0):
        return f"{s} {s}^T"
    parts = []
    if m.ind:
        parts.append(f"indicator({s})")
    if m.zp:
        parts.append(s if m.zp == 1 else f"{s}^{_fmt(m.zp)}")
    if m.wp:
        parts.append(f"(1-{s})" if m.wp == 1 else f"(1-{s})^{_fmt(m.wp)}")
    if m.lz:
        parts.append(f"log {s}" if m.lz == 1 else f"(log {s})^{m.lz}")
    if m.lw:
        parts.append(f"log(1-{s})" if m.lw == 1 else f"(log(1-{s}))^{m.lw}")
    name = " ".join(parts)
    if m.cross and not m.ind:
        name = f"{name} (across elements of {s})"
    return name


def describe(ctx: Ctx, a) -> str:
    """Short description of how a value depends on the target ('' when constant)."""
    s = ctx.name
    if a is None or not isinstance(a, (Poly, Opaque)):
        return ""
    if isinstance(a, Opaque):
        return a.desc
    monos = sorted(a.nonconst(), key=_mono_order)
    if not monos:
        return ""
    if all(m.ind for m in monos):
        return f"indicator({s})"
    plain = {Mono(m.zp, m.wp, m.lz, m.lw, m.ind) for m in monos}
    if plain == {Mono(zp=1.0)}:
        return f"linear in {s}"
    if plain == {Mono(zp=1.0), Mono(zp=2.0)} or (plain == {Mono(zp=2.0)} and len(monos) > 1):
        return f"quadratic in {s}"
    if plain == {LOGZ, LOGW}:
        return f"linear in (log {s}, log(1-{s}))"
    if len(monos) == 1:
        return mono_name(monos[0], s)
    if len(monos) > 6:  # a long polynomial: its ends and its length
        ends = (mono_name(monos[0], s), mono_name(monos[-1], s))
        return f"{ends[0]} + ... + {ends[1]} ({len(monos)} terms)"
    return " + ".join(mono_name(m, s) for m in monos)


def _mono_order(m: Mono):
    return (m.ind, m.lz + m.lw, m.lz, m.lw, abs(m.zp) + abs(m.wp), m.zp, m.wp, m.cross)


def mono_eval(m: Mono, z: np.ndarray) -> np.ndarray:
    """Numeric value of a (non-cross, non-indicator) monomial at ``z``."""
    out = np.ones_like(z, dtype=float)
    with np.errstate(all="ignore"):
        if m.zp:
            out = out * np.power(z, m.zp)
        if m.wp:
            out = out * np.power(1.0 - z, m.wp)
        if m.lz:
            out = out * np.log(z) ** m.lz
        if m.lw:
            out = out * np.log1p(-z) ** m.lw
    return out
