"""Tests for reading a FactorGraph: table, networkx, DOT, render, and lookups."""

from __future__ import annotations

import re
import shutil

import jax.numpy as jnp
import networkx as nx
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints

import autocvi
from autocvi import EdgeInfo, FactorGraph


def hierarchical(X, y, S=4):
    scale = numpyro.param("scale", 1.0, constraint=constraints.positive)
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("groups", 3):
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        with numpyro.plate("items", 8, subsample_size=S, dim=-2) as idx:
            mean = jnp.einsum("igd,d->ig", X[idx], w) + b
            numpyro.sample("y", dist.Normal(mean, scale), obs=y[idx])
    numpyro.factor("shrink", -jnp.sum(b**2))


@pytest.fixture(scope="module")
def graph() -> FactorGraph:
    X = np.ones((8, 3, 2))
    y = np.zeros((8, 3))
    return autocvi.trace(hierarchical, {"X": X, "y": y}, classify=False)


def rows(table: str, section: str) -> list[list[str]]:
    """The data rows of one section of the printed table, split into cells."""
    lines = table.splitlines()
    start = lines.index(section)
    body = []
    for line in lines[start + 3 :]:  # skip title, header, rule
        if not line.strip():
            break
        body.append(re.split(r"\s{2,}", line.strip()))
    return body


# --------------------------------------------------------------------- graph


def test_graph_structure(graph):
    assert set(graph.variables) == {"w", "b", "y"}
    assert set(graph.factors) == {"w", "b", "y", "shrink"}
    assert graph.factors["y"].latents == ("w", "b")
    assert graph.factors["y"].params == ("scale",)
    assert graph.factors["shrink"].latents == ("b",)
    G = autocvi.PlateInfo("groups", 3, 3, -1)
    items = autocvi.PlateInfo("items", 8, 4, -2)
    assert graph.variables["y"].plates == (G, items)
    assert graph.variables["b"].plates == (G,)


# --------------------------------------------------------------------- table


def test_table_lists_every_site_with_role_plates_and_parents(graph):
    text = str(graph)
    assert text == graph.table()
    assert text.splitlines()[0] == "FactorGraph: 2 latent, 1 observed, 4 factors, 1 params"
    header = text.splitlines()[text.splitlines().index("Variables") + 1].split()
    assert header == ["site", "role", "distribution", "shape", "plates", "parents", "q", "family"]
    variables = {r[0]: r for r in rows(text, "Variables")}
    assert set(variables) == {"w", "b", "y"}
    assert variables["w"][:5] == ["w", "latent", "Normal", "(2,)", "-"]
    assert variables["b"][:5] == ["b", "latent", "Normal", "(3,)", "groups[3]"]
    assert variables["y"][:6] == [
        "y",
        "observed",
        "Normal",
        "(4, 3)",
        "groups[3], items[4/8]",
        "w, b, scale",
    ]
    factors = {r[0]: r for r in rows(text, "Factors (edges to latents, with conjugacy verdicts)")}
    assert set(factors) == {"w", "b", "y", "shrink"}
    assert factors["shrink"][:3] == ["shrink", "factor", "factor"]
    assert factors["y"][1:5] == ["likelihood", "Normal", "w (?); b (?)", "scale"]
    params = {r[0]: r for r in rows(text, "Params")}
    assert params == {"scale": ["scale", "()", "positive"]}


def test_table_shows_verdicts_and_families_when_known(graph):
    g = graph.with_families({"w": "MultivariateNormal"}).with_edges(
        {
            ("y", "w"): EdgeInfo(conjugate=True, reason="linear", message="exact"),
            ("y", "b"): EdgeInfo(conjugate=False, reason="nonlinear"),
        }
    )
    text = str(g)
    factors = {r[0]: r for r in rows(text, "Factors (edges to latents, with conjugacy verdicts)")}
    assert factors["y"][3] == "w (conjugate, exact); b (NON-conjugate)"
    variables = {r[0]: r for r in rows(text, "Variables")}
    assert variables["w"][-1] == "MultivariateNormal"
    # the original graph is unchanged
    assert graph.variables["w"].family is None and graph.edges == {}


def test_table_of_an_empty_model():
    g = autocvi.trace(lambda: None, {}, classify=False)
    text = str(g)
    assert text.splitlines()[0] == "FactorGraph: 0 latent, 0 observed, 0 factors, 0 params"
    assert "site" in text and "factor" in text


# ------------------------------------------------------------------ networkx


def test_to_networkx_nodes_carry_the_site_attributes(graph):
    g = graph.to_networkx()
    assert isinstance(g, nx.Graph)
    for name in ("w", "b", "y", "scale"):
        assert name in g.nodes
    assert set(g.nodes) == {
        "w",
        "b",
        "y",
        "scale",
        "factor:w",
        "factor:b",
        "factor:y",
        "factor:shrink",
    }
    y = g.nodes["y"]
    assert y["kind"] == "observed" and y["observed"] is True
    assert y["distribution"] == "Normal" and y["support"] == "real"
    assert y["shape"] == (4, 3) and y["event_shape"] == () and y["batch_shape"] == (4, 3)
    assert y["plates"] == (
        {"name": "groups", "size": 3, "subsample_size": 3, "dim": -1},
        {"name": "items", "size": 8, "subsample_size": 4, "dim": -2},
    )
    assert g.nodes["w"]["kind"] == "latent" and g.nodes["w"]["event_shape"] == (2,)
    assert g.nodes["scale"]["kind"] == "param" and g.nodes["scale"]["constraint"] == "positive"
    fy = g.nodes["factor:y"]
    assert fy["kind"] == "factor" and fy["factor_kind"] == "likelihood"
    assert fy["latents"] == ("w", "b") and fy["params"] == ("scale",)
    assert g.nodes["factor:shrink"]["factor_kind"] == "factor"


def test_to_networkx_edges(graph):
    g = graph.to_networkx()
    roles = {tuple(sorted(e)): d["role"] for *e, d in g.edges(data=True)}
    assert roles == {
        ("factor:w", "w"): "scores",
        ("b", "factor:b"): "scores",
        ("factor:y", "y"): "scores",
        ("factor:y", "w"): "parent",
        ("b", "factor:y"): "parent",
        ("factor:y", "scale"): "param",
        ("b", "factor:shrink"): "parent",
    }
    # bipartite: every edge joins a factor to a variable or param
    for u, v in g.edges:
        assert (g.nodes[u]["kind"] == "factor") != (g.nodes[v]["kind"] == "factor")
    # every edge carries the same attributes
    keys = {"role", "conjugate", "reason", "statistics", "message"}
    assert all(set(d) == keys for *_, d in g.edges(data=True))


def test_to_networkx_edges_carry_verdicts(graph):
    edge = EdgeInfo(conjugate=True, reason="linear in w", statistics=("w",), message="exact")
    g = graph.with_edges({("y", "w"): edge}).to_networkx()
    d = g.edges["factor:y", "w"]
    assert (d["conjugate"], d["reason"], d["statistics"], d["message"]) == (
        True,
        "linear in w",
        ("w",),
        "exact",
    )
    assert g.edges["factor:y", "b"]["conjugate"] is None


# ----------------------------------------------------------------------- DOT


def node_lines(dot: str) -> dict[str, str]:
    out = {}
    for line in dot.splitlines():
        m = re.match(r'\s*"([^"]+)" \[(.*)\];$', line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def test_to_dot_clusters_per_plate_with_nesting(graph):
    dot = graph.to_dot()
    assert dot.startswith("graph factor_graph {") and dot.rstrip().endswith("}")
    assert dot.count('subgraph "cluster_groups" {') == 1
    assert dot.count('subgraph "cluster_items" {') == 1
    # items is nested inside groups; y sits in items, b in groups only
    lines = dot.splitlines()
    where = {}
    stack = []
    for line in lines[1:]:
        m = re.match(r'\s*subgraph "(cluster_\w+)" \{', line)
        if m:
            stack.append(m.group(1))
            continue
        if line.strip() == "}":
            if stack:
                stack.pop()
            continue
        n = re.match(r'\s*"([^"]+)" \[', line)
        if n:
            where[n.group(1)] = tuple(stack)
    assert where["y"] == ("cluster_groups", "cluster_items")
    assert where["factor:y"] == ("cluster_groups", "cluster_items")
    assert where["b"] == ("cluster_groups",)
    assert where["w"] == () and where["scale"] == () and where["factor:shrink"] == ()
    assert 'label="items[4/8]"' in dot and 'label="groups[3]"' in dot


def test_to_dot_styles_latent_observed_factor_param(graph):
    nodes = node_lines(graph.to_dot())
    assert set(nodes) == {
        "w",
        "b",
        "y",
        "scale",
        "factor:w",
        "factor:b",
        "factor:y",
        "factor:shrink",
    }
    assert 'fillcolor="white"' in nodes["w"] and "shape=ellipse" in nodes["w"]
    assert 'fillcolor="grey80"' in nodes["y"] and "shape=ellipse" in nodes["y"]
    assert "shape=square" in nodes["factor:y"] and "fillcolor=black" in nodes["factor:y"]
    assert "shape=plaintext" in nodes["scale"]
    styles = {nodes["w"], nodes["y"], nodes["factor:y"], nodes["scale"]}
    assert len(styles) == 4


def test_to_dot_edges(graph):
    g = graph.with_edges(
        {
            ("y", "w"): EdgeInfo(conjugate=True, message="exact"),
            ("y", "b"): EdgeInfo(conjugate=False, message="gauss-hermite"),
        }
    )
    dot = g.to_dot()
    assert '"factor:y" -- "y";' in dot
    assert '"factor:y" -- "w" [color="forestgreen", tooltip="exact"];' in dot
    assert '"factor:y" -- "b" [style=dashed, color="royalblue", tooltip="gauss-hermite"];' in dot
    assert '"factor:y" -- "scale" [style=dotted];' in dot
    assert '"factor:shrink" -- "b";' in dot
    plain = g.to_dot(color_by_message=False)
    assert '"factor:y" -- "w";' in plain and '"factor:y" -- "b" [style=dashed];' in plain


def test_to_dot_plate_entered_twice_gets_two_clusters():
    def model(y):
        with numpyro.plate("K", 2):
            a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", 3, dim=-2), numpyro.plate("K", 2):
            numpyro.sample("y", dist.Normal(a, 1.0), obs=y)

    dot = autocvi.trace(model, {"y": np.zeros((3, 2))}, classify=False).to_dot()
    names = re.findall(r'subgraph "([^"]+)"', dot)
    assert len(names) == len(set(names)) == 3
    assert names[0] == "cluster_K" and "cluster_N" in names


def test_to_dot_escapes_quotes_in_names():
    def model():
        numpyro.sample('odd "name"', dist.Normal(0.0, 1.0))

    dot = autocvi.trace(model, {}, classify=False).to_dot()
    assert '"odd \\"name\\"" [label="odd \\"name\\"\\nNormal"' in dot


# -------------------------------------------------------------------- render


def test_render_without_graphviz_says_how_to_install(graph, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    with pytest.raises(RuntimeError) as e:
        graph.render(tmp_path / "g.png")
    msg = str(e.value).lower()
    assert "graphviz" in msg and "install" in msg and "to_dot" in msg
    assert not (tmp_path / "g.png").exists()


def test_render_rejects_unknown_format(graph, tmp_path):
    with pytest.raises(ValueError, match=r"\.png, \.svg"):
        graph.render(tmp_path / "g.jpg")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed")
@pytest.mark.parametrize("suffix", ["svg", "png"])
def test_render_writes_a_file(graph, tmp_path, suffix):
    out = graph.render(tmp_path / f"g.{suffix}")
    assert out == tmp_path / f"g.{suffix}" and out.stat().st_size > 0
    if suffix == "svg":
        assert "<svg" in out.read_text()


# ------------------------------------------------------------------- lookups


def test_unknown_factor_or_latent_raise_key_error(graph):
    with pytest.raises(KeyError, match=r"'nope' is not a factor.*factors: w, b, y, shrink"):
        graph.explain("nope", "w")
    with pytest.raises(KeyError, match=r"'nope' is not a latent site.*latent sites: w, b"):
        graph.is_conjugate("y", "nope")
    with pytest.raises(KeyError, match=r"'y' is not a latent site"):
        graph.explain("y", "y")  # observed, not latent
    with pytest.raises(KeyError, match=r"factor 'w' does not depend on 'b'; it depends on w"):
        graph.is_conjugate("w", "b")
    with pytest.raises(KeyError, match=r"'nope' is not a latent site"):
        graph.factors_of("nope")
    with pytest.raises(KeyError, match=r"'nope' is not a factor"):
        graph.log_density_fn("nope")


def test_explain_and_is_conjugate(graph):
    assert graph.explain("y", "w") == "y -> w: not classified (traced with classify=False)."
    with pytest.raises(RuntimeError, match="classify"):
        graph.is_conjugate("y", "w")
    g = graph.with_families({"w": "MultivariateNormal", "b": "Normal"}).with_edges(
        {
            ("y", "w"): EdgeInfo(True, "linear in w.", ("w",), "exact"),
            ("y", "b"): EdgeInfo(False, "b enters through exp.", (), "gauss-hermite"),
        }
    )
    assert g.is_conjugate("y", "w") is True and g.is_conjugate("y", "b") is False
    assert g.explain("y", "w") == (
        "y -> w [MultivariateNormal]: conjugate. linear in w. Message: exact."
    )
    assert g.explain("y", "b").startswith("y -> b [Normal]: non-conjugate.")
