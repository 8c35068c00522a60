"""The factor graph autocvi builds from a NumPyro model, as plain data.

A :class:`FactorGraph` has one variable node per sample site (latent or
observed), one factor node per sample site's conditional density and per
``numpyro.factor``, and hyperparameter nodes for ``numpyro.param`` sites. It
prints as a table, converts to :mod:`networkx`, and renders to Graphviz DOT.
The conjugacy verdicts (``autocvi.conjugacy``) and message kinds
(``autocvi.schedule``) are attached to its factor-latent edges.

Nothing here runs inference: the graph is built by :func:`autocvi.trace`.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import networkx as nx

from .message_kinds import MESSAGE_KINDS

__all__ = [
    "PlateInfo",
    "VariableNode",
    "FactorNode",
    "ParamNode",
    "EdgeInfo",
    "FactorGraph",
]


@dataclass(frozen=True)
class PlateInfo:
    """A ``numpyro.plate`` enclosing a site.

    ``size`` is the full size N, ``subsample_size`` the minibatch size B
    (equal to ``size`` when the plate is not subsampled) and ``dim`` the
    (negative) batch dimension the plate occupies.
    """

    name: str
    size: int
    subsample_size: int
    dim: int

    @property
    def subsampled(self) -> bool:
        return self.subsample_size < self.size

    def __str__(self) -> str:
        if self.subsampled:
            return f"{self.name}[{self.subsample_size}/{self.size}]"
        return f"{self.name}[{self.size}]"


@dataclass(frozen=True)
class VariableNode:
    """A sample site.

    Attributes:
        name: the site name.
        observed: True for observed sites (``obs=`` given).
        distribution: the numpyro distribution's class name, wrappers removed
            (e.g. ``"Normal"`` for ``Normal(0, 1).expand([3]).to_event(1)``).
        support: the support constraint, as text.
        shape: the value's shape, ``batch_shape + event_shape``.
        batch_shape, event_shape: of the site's distribution.
        plates: the enclosing plates, outermost first.
        discrete: True when the support is discrete.
        family: the variational family chosen for a latent (filled in by
            the conjugacy analysis), ``None`` for observed sites.
    """

    name: str
    observed: bool
    distribution: str
    support: str
    shape: tuple[int, ...]
    batch_shape: tuple[int, ...]
    event_shape: tuple[int, ...]
    plates: tuple[PlateInfo, ...]
    discrete: bool
    family: str | None = None

    @property
    def role(self) -> str:
        return "observed" if self.observed else "latent"


@dataclass(frozen=True)
class FactorNode:
    """A term of the joint log density.

    ``kind`` is ``"prior"`` (a latent site's own conditional density),
    ``"likelihood"`` (an observed site's density) or ``"factor"``
    (``numpyro.factor``). ``latents`` are the latent sites the term depends
    on (its neighbours, including the site itself for a prior), ``params``
    the ``numpyro.param`` sites it uses.
    """

    name: str
    site: str
    kind: str
    latents: tuple[str, ...]
    params: tuple[str, ...]
    plates: tuple[PlateInfo, ...]
    distribution: str


@dataclass(frozen=True)
class ParamNode:
    """A ``numpyro.param`` site: a hyperparameter, learned or fixed.

    ``constraint`` names the param's support; ``support`` is the numpyro
    constraint itself (``biject_to(support)`` maps the unconstrained space the
    M-step optimises in onto it).
    """

    name: str
    shape: tuple[int, ...]
    constraint: str
    support: Any = field(default=None, compare=False, repr=False)
    # The param carries the model's data (``numpyro.param(name, value,
    # autocvi_data=True)``, as ``autocvi.CVI`` passes array arguments): a constant of
    # the priors that read it, whatever its value.
    data: bool = False


@dataclass(frozen=True)
class EdgeInfo:
    """What autocvi knows about a (factor, latent) edge.

    ``conjugate`` is ``None`` until the conjugacy analysis has run.
    ``message`` names the message kind chosen by the planner (``None`` until
    planned).
    """

    conjugate: bool | None = None
    reason: str = ""
    statistics: tuple[str, ...] = ()
    message: str | None = None


# Colours for message kinds in DOT output, from the message-kind registry.
MESSAGE_COLOURS = {k.name: k.colour for k in MESSAGE_KINDS.values()}


@dataclass
class FactorGraph:
    """The factor graph of a NumPyro model, as autocvi sees it.

    Build one with :func:`autocvi.trace`. ``print(graph)`` shows it as a
    table; :meth:`to_networkx`, :meth:`to_dot` and :meth:`render` export it.
    """

    variables: dict[str, VariableNode]
    factors: dict[str, FactorNode]
    params: dict[str, ParamNode]
    edges: dict[tuple[str, str], EdgeInfo] = field(default_factory=dict)
    # Integrated children (autocvi.analysis.integrate): factor -> the values key of the
    # integrated latent's standardised residual, which evaluates the child as written.
    residuals: dict[str, str] = field(default_factory=dict, repr=False)
    # Hidden plumbing used by the analyses: how to evaluate one factor's log
    # density. Set by the tracer; not part of the printed graph.
    _site_fn_builder: Callable[[str], Callable] | None = field(default=None, repr=False)
    _example_values: dict[str, Any] = field(default_factory=dict, repr=False)
    # One eager run of the model at the example values, shared by the analyses that read
    # sites' distributions (each eager run of a model with a lax.scan compiles the scan).
    _example_trace: dict | None = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------------ access
    @property
    def latent_names(self) -> tuple[str, ...]:
        """Latent sites in model order."""
        return tuple(n for n, v in self.variables.items() if not v.observed)

    @property
    def observed_names(self) -> tuple[str, ...]:
        return tuple(n for n, v in self.variables.items() if v.observed)

    @property
    def deterministic_names(self) -> tuple[str, ...]:
        """``numpyro.deterministic`` sites in model order (functions of the latents)."""
        if self._site_fn_builder is None:
            return ()
        sites = self._trace_at_example().items()
        return tuple(n for n, s in sites if s["type"] == "deterministic")

    @property
    def example_values(self) -> dict[str, Any]:
        """One draw of every latent and param site (the trace's values)."""
        return dict(self._example_values)

    def draw_latents(self, rng_key) -> dict[str, Any]:
        """A fresh prior draw of every latent site, params held at their values.

        A pure JAX function of ``rng_key`` (usable under ``jit``); shapes as in
        :attr:`example_values`.
        """
        params = {n: self._example_values[n] for n in self.params}
        tr = self._site_fn_builder.run(params, rng_key=rng_key)
        return {n: tr[n]["value"] for n in self.latent_names}

    def example_site(self, name: str) -> tuple:
        """``(distribution, value)`` of site ``name`` at :attr:`example_values` (as
        ``site_fn(name)(example_values)``, from one run of the model per graph)."""
        site = self._trace_at_example()[name]
        return site["fn"], site["value"]

    def example_trace_site(self, name: str) -> dict:
        """Site ``name`` of the model's trace at :attr:`example_values` (its ``infer``
        dict, distribution and value)."""
        return self._trace_at_example()[name]

    def _trace_at_example(self) -> dict:
        """The model's trace at :attr:`example_values`, run once per graph and kept."""
        if self._example_trace is None:
            self._example_trace = self._site_fn_builder.run(self._example_values)
        return self._example_trace

    def factors_of(self, latent: str) -> tuple[str, ...]:
        """Names of the factors whose density depends on ``latent``."""
        self._check_latent(latent)
        return tuple(f.name for f in self.factors.values() if latent in f.latents)

    def site_fn(self, factor: str) -> Callable:
        """``f(values) -> (distribution, value)`` for one factor.

        ``values`` maps latent (and param) site names to arrays; the factor's
        log density per plate element is ``distribution.log_prob(value)``.
        """
        self._check_factor(factor)
        return self._site_fn_builder(factor)

    def log_density_fn(self, factor: str) -> Callable:
        """``f(values) -> array``: the factor's log density per plate element.

        Scale (N/B of subsampled plates) and masks are applied. The array's
        shape is the batch shape of the factor's site.
        """
        site_fn = self.site_fn(factor)

        def log_density(values):
            fn, value, scale = site_fn(values, with_scale=True)
            lp = fn.log_prob(value)
            return lp if scale is None else lp * scale

        return log_density

    def is_conjugate(self, factor: str, latent: str) -> bool:
        """True when ``factor`` is conditionally conjugate to ``latent``'s family.

        Raises ``KeyError`` naming the valid pairs when the edge does not
        exist, and ``RuntimeError`` when the graph was traced with
        ``classify=False``.
        """
        edge = self._edge(factor, latent)
        if edge.conjugate is None:
            raise RuntimeError(
                "this graph has no conjugacy verdicts: build it with autocvi.trace(model, data)"
                " (classify=True, the default)"
            )
        return edge.conjugate

    def explain(self, factor: str, latent: str) -> str:
        """A sentence saying why the edge (factor, latent) is or is not conjugate."""
        edge = self._edge(factor, latent)
        if edge.conjugate is None:
            return f"{factor} -> {latent}: not classified (traced with classify=False)."
        verdict = "conjugate" if edge.conjugate else "non-conjugate"
        family = self.variables[latent].family
        text = f"{factor} -> {latent} [{family}]: {verdict}. {edge.reason}"
        if edge.message:
            text += f" Message: {edge.message}."
        return text

    # ---------------------------------------------------------------- updates
    def with_edges(self, edges: dict[tuple[str, str], EdgeInfo]) -> FactorGraph:
        """A copy of the graph with some edges' information replaced."""
        new_edges = dict(self.edges)
        new_edges.update(edges)
        return replace(self, edges=new_edges)

    def with_families(self, families: dict[str, str]) -> FactorGraph:
        """A copy of the graph with the latents' variational families set."""
        variables = {
            n: replace(v, family=families.get(n, v.family)) for n, v in self.variables.items()
        }
        return replace(self, variables=variables)

    # --------------------------------------------------------------- printing
    def __str__(self) -> str:
        return self.table()

    def table(self) -> str:
        """The graph as two plain-text tables: variables, then factors."""
        var_rows = [
            (
                v.name,
                v.role,
                v.distribution,
                _fmt_shape(v.shape),
                ", ".join(str(p) for p in v.plates) or "-",
                ", ".join(self._parents_of(v.name)) or "-",
                v.family or "-",
            )
            for v in self.variables.values()
        ]
        fac_rows = []
        for f in self.factors.values():
            edges = []
            for latent in f.latents:
                e = self.edges.get((f.name, latent), EdgeInfo())
                if e.conjugate is None:
                    tag = "?"
                else:
                    tag = "conjugate" if e.conjugate else "NON-conjugate"
                if e.message:
                    tag += f", {e.message}"
                edges.append(f"{latent} ({tag})")
            fac_rows.append(
                (
                    f.name,
                    f.kind,
                    f.distribution,
                    "; ".join(edges) or "-",
                    ", ".join(f.params) or "-",
                    ", ".join(str(p) for p in f.plates) or "-",
                )
            )
        n_lat = len(self.latent_names)
        n_obs = len(self.observed_names)
        head = (
            f"FactorGraph: {n_lat} latent, {n_obs} observed, "
            f"{len(self.factors)} factors, {len(self.params)} params"
        )
        parts = [
            head,
            "",
            "Variables",
            _format_table(
                ("site", "role", "distribution", "shape", "plates", "parents", "q family"),
                var_rows,
            ),
            "",
            "Factors (edges to latents, with conjugacy verdicts)",
            _format_table(
                ("factor", "kind", "density", "latents (verdict)", "params", "plates"), fac_rows
            ),
        ]
        if self.params:
            parts += [
                "",
                "Params",
                _format_table(
                    ("param", "shape", "constraint"),
                    [(p.name, _fmt_shape(p.shape), p.constraint) for p in self.params.values()],
                ),
            ]
        return "\n".join(parts)

    def _parents_of(self, site: str) -> tuple[str, ...]:
        factor = self.factors.get(site)
        if factor is None:
            return ()
        return tuple(n for n in factor.latents if n != site) + factor.params

    # ---------------------------------------------------------------- export
    def to_networkx(self) -> nx.Graph:
        """The factor graph as an undirected bipartite :class:`networkx.Graph`.

        Variable nodes are keyed by site name (``kind`` = ``"latent"`` or
        ``"observed"``), param nodes by param name (``kind="param"``), factor
        nodes by ``"factor:<name>"`` (``kind="factor"``). Every node carries its
        dataclass fields as attributes. Edges join a factor to the variables
        and params it touches; factor-latent edges carry ``role``
        (``"scores"`` for the site the factor is the density of, ``"parent"``
        otherwise), ``conjugate``, ``reason``, ``statistics`` and ``message``.
        """
        g = nx.Graph()
        for v in self.variables.values():
            attrs = _node_attrs(v)
            attrs["kind"] = v.role
            g.add_node(v.name, **attrs)
        for p in self.params.values():
            attrs = _node_attrs(p)
            attrs["kind"] = "param"
            g.add_node(p.name, **attrs)
        for f in self.factors.values():
            attrs = _node_attrs(f)
            attrs["factor_kind"] = attrs.pop("kind")
            attrs["kind"] = "factor"
            key = factor_key(f.name)
            g.add_node(key, **attrs)
            if f.site in self.variables and self.variables[f.site].observed:
                g.add_edge(key, f.site, **_edge_attrs("scores", EdgeInfo()))
            for latent in f.latents:
                e = self.edges.get((f.name, latent), EdgeInfo())
                role = "scores" if latent == f.site else "parent"
                g.add_edge(key, latent, **_edge_attrs(role, e))
            for p in f.params:
                g.add_edge(key, p, **_edge_attrs("param", EdgeInfo()))
        return g

    def to_dot(self, color_by_message: bool = True) -> str:
        """Graphviz DOT text: plates as clusters, latent/observed/factor/param styled.

        Latent sites are white ellipses, observed sites grey ellipses, factors
        small black squares, params plain text. Conjugate edges are solid and
        non-conjugate ones dashed; with ``color_by_message`` edges are coloured
        by the planned message kind (see ``MESSAGE_COLOURS``).
        """
        lines = [
            "graph factor_graph {",
            "  graph [compound=true, fontsize=10];",
            '  node [fontname="Helvetica", fontsize=10];',
        ]

        def node_line(key: str, attrs: str) -> str:
            return f"  {_q(key)} [{attrs}];"

        node_decl: dict[str, str] = {}
        node_plates: dict[str, tuple[PlateInfo, ...]] = {}
        for v in self.variables.values():
            style = (
                'shape=ellipse, style=filled, fillcolor="grey80"'
                if v.observed
                else 'shape=ellipse, style=filled, fillcolor="white"'
            )
            label = _esc(v.name) + "\\n" + _esc(v.distribution)
            node_decl[v.name] = node_line(v.name, f'label="{label}", {style}')
            node_plates[v.name] = v.plates
        for p in self.params.values():
            node_decl[p.name] = node_line(p.name, f"label={_q(p.name)}, shape=plaintext")
            node_plates[p.name] = ()
        for f in self.factors.values():
            key = factor_key(f.name)
            node_decl[key] = node_line(
                key,
                'label="", shape=square, style=filled, fillcolor=black, width=0.15, height=0.15,'
                f" xlabel={_q(f.name)}",
            )
            node_plates[key] = f.plates

        # Group nodes by their plate stack; nested plates become nested clusters.
        tree: dict = {}
        for key, plates in node_plates.items():
            level = tree
            for plate in plates:
                level = level.setdefault(("plate", plate.name, str(plate)), {})
            level.setdefault(("nodes",), []).append(key)

        # A plate entered in two places (alone, and inside another plate) gives
        # two clusters; DOT merges subgraphs of the same name, so the second is
        # "cluster_<plate>_2".
        cluster_names: set[str] = set()

        def cluster_name(plate: str) -> str:
            name, k = f"cluster_{plate}", 1
            while name in cluster_names:
                k += 1
                name = f"cluster_{plate}_{k}"
            cluster_names.add(name)
            return name

        def emit(level: dict, indent: str) -> None:
            for k, sub in level.items():
                if k == ("nodes",):
                    for key in sub:
                        lines.append(indent + node_decl[key].strip())
                else:
                    _, name, label = k
                    lines.append(f"{indent}subgraph {_q(cluster_name(name))} {{")
                    lines.append(f"{indent}  label={_q(label)}; style=rounded;")
                    emit(sub, indent + "  ")
                    lines.append(f"{indent}}}")

        emit(tree, "  ")
        for f in self.factors.values():
            key = factor_key(f.name)
            if f.site in self.variables and self.variables[f.site].observed:
                lines.append(f"  {_q(key)} -- {_q(f.site)};")
            for latent in f.latents:
                e = self.edges.get((f.name, latent), EdgeInfo())
                attrs = []
                if e.conjugate is False:
                    attrs.append("style=dashed")
                if color_by_message and e.message in MESSAGE_COLOURS:
                    attrs.append(f'color="{MESSAGE_COLOURS[e.message]}"')
                    attrs.append(f'tooltip="{e.message}"')
                suffix = f" [{', '.join(attrs)}]" if attrs else ""
                lines.append(f"  {_q(key)} -- {_q(latent)}{suffix};")
            for p in f.params:
                lines.append(f"  {_q(key)} -- {_q(p)} [style=dotted];")
        lines.append("}")
        return "\n".join(lines)

    def render(self, path: str | Path, color_by_message: bool = True) -> Path:
        """Write the graph as PNG or SVG (chosen by ``path``'s suffix).

        Needs the Graphviz ``dot`` program. Raises ``RuntimeError`` saying how
        to install it when it is missing.
        """
        path = Path(path)
        fmt = path.suffix.lstrip(".").lower()
        if fmt not in ("png", "svg", "pdf"):
            raise ValueError(f"render: use a .png, .svg or .pdf path, not {path.name!r}")
        dot = shutil.which("dot")
        if dot is None:
            raise RuntimeError(
                "render needs the Graphviz 'dot' program, which is not on PATH. Install it with "
                "'apt-get install graphviz' (Debian/Ubuntu), 'brew install graphviz' (macOS) or "
                "'conda install graphviz'; or write graph.to_dot() to a file and render it elsewhere."
            )
        subprocess.run(
            [dot, f"-T{fmt}", "-o", str(path)],
            input=self.to_dot(color_by_message).encode(),
            check=True,
        )
        return path

    # ----------------------------------------------------------------- checks
    def _check_latent(self, latent: str) -> None:
        if latent not in self.variables or self.variables[latent].observed:
            raise KeyError(
                f"{latent!r} is not a latent site of this model; latent sites: "
                f"{', '.join(self.latent_names)}"
            )

    def _check_factor(self, factor: str) -> None:
        if factor not in self.factors:
            raise KeyError(
                f"{factor!r} is not a factor of this model; factors: {', '.join(self.factors)}"
            )

    def _edge(self, factor: str, latent: str) -> EdgeInfo:
        self._check_factor(factor)
        self._check_latent(latent)
        if latent not in self.factors[factor].latents:
            raise KeyError(
                f"factor {factor!r} does not depend on {latent!r}; it depends on "
                f"{', '.join(self.factors[factor].latents) or 'no latent'}"
            )
        return self.edges.get((factor, latent), EdgeInfo())


def factor_key(name: str) -> str:
    """The networkx/DOT node key of a factor."""
    return f"factor:{name}"


def _edge_attrs(role: str, e: EdgeInfo) -> dict:
    return {
        "role": role,
        "conjugate": e.conjugate,
        "reason": e.reason,
        "statistics": e.statistics,
        "message": e.message,
    }


def _node_attrs(obj) -> dict:
    attrs = dict(obj.__dict__)
    if "plates" in attrs:
        attrs["plates"] = tuple(
            {
                "name": p.name,
                "size": p.size,
                "subsample_size": p.subsample_size,
                "dim": p.dim,
            }
            for p in attrs["plates"]
        )
    return attrs


def _esc(s: str) -> str:
    """Escape text for a double-quoted DOT string."""
    return str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _q(s: str) -> str:
    return '"' + _esc(s) + '"'


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _format_table(header: tuple[str, ...], rows: list[tuple]) -> str:
    cols = list(zip(header, *rows)) if rows else [(h,) for h in header]
    widths = [max(len(str(c)) for c in col) for col in cols]
    fmt = "  ".join("{:<" + str(w) + "}" for w in widths)
    out = [fmt.format(*header).rstrip(), fmt.format(*("-" * w for w in widths)).rstrip()]
    out += [fmt.format(*(str(c) for c in row)).rstrip() for row in rows]
    return "\n".join("  " + line for line in out)
