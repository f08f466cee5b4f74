"""The import graph, read from the source: one package per program, each importing only its own
package, what the programs share (common/), and the libraries its install brings; no module in a
circle. The node agent imports nothing of the other programs nor their libraries outside its
command line, which dispatches `rules`, `dashboards` and `report` to them."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from tests.helpers import FOLDERS, ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROGRAMS = tuple(FOLDERS)
# Which install each program comes with (pyproject.toml): the package's dependencies, and its extra.
EXTRAS = {"gpunode_rulepack": ("rules", "dashboards"), "gpunode_report": ("report",)}
# What each program's package may import of the project's own.
OWN = {"gpunode_common": {"gpunode_common"}, "gpunode_exporter": {"gpunode_common", "gpunode_exporter"},
       "gpunode_rulepack": {"gpunode_common", "gpunode_rulepack"},
       # the rule pack's spec: the report's selectors
       "gpunode_report": {"gpunode_common", "gpunode_report", "gpunode_rulepack"},
       "gpunode_remediate": {"gpunode_common", "gpunode_remediate"}}
DISPATCHER = "gpunode_exporter.cli"  # dispatches to gpunode_rulepack.cli and gpunode_report.cli, inside functions
# Packages whose modules the graph reads for circles: (the directory their folder is in, the folder, the
# import name).
GRAPHED = [(ROOT, FOLDERS.get(p, p), p) for p in (*PROGRAMS, "fleet", "demo", "tests")] + [
    (ROOT / "benchmarks", p.name, p.name) for p in sorted((ROOT / "benchmarks").glob("*_bench"))]


def modules(base: Path, folder: str, package: str) -> dict[str, Path]:
    found = {}
    for path in sorted((base / folder).rglob("*.py")):
        if "fixtures" in path.parts:
            continue
        name = ".".join((package, *path.relative_to(base / folder).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = path
    return found


ALL = {name: path for base, folder, package in GRAPHED for name, path in modules(base, folder, package).items()}


def imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(module imported, at module level) for every import statement, relative ones resolved; a name
    imported from a package that is a module of its own counts as that module."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in ALL]
            out += [(s, id(node) in top) for s in subs]
            if len(subs) < len(node.names):
                out.append((base, id(node) in top))
    return out


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in ALL.items():
        edges[name] = set()
        for target, _ in imports(name, path):
            while target and target not in ALL:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges[name].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def third_party(program: str) -> dict[str, set[str]]:
    """module -> the libraries (top-level import names) it imports from outside the project."""
    first = {package for _, _, package in GRAPHED}
    out = {}
    for name, path in ALL.items():
        if name.split(".")[0] == program:
            out[name] = {t.split(".")[0] for t, _ in imports(name, path)
                         if t and t.split(".")[0] not in sys.stdlib_module_names | first}
    return out


def installed_by(program: str) -> set[str]:
    """The import names of the distributions the program's install brings (pyproject.toml)."""
    project = PROJECT["project"]
    wanted = list(project["dependencies"])
    for extra in EXTRAS.get(program, ()):
        wanted += project["optional-dependencies"][extra]
    names = {re.split(r"[<>=!~\[ ;]", w, maxsplit=1)[0].lower().replace("_", "-") for w in wanted}
    return {module for module, dists in importlib.metadata.packages_distributions().items()
            if any(d.lower().replace("_", "-") in names for d in dists)}


def test_no_module_imports_in_a_circle() -> None:
    assert not circles(graph())


def test_the_circle_finder_finds_one() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_program_imports_only_its_own_and_what_it_shares() -> None:
    wrong = []
    for name, path in ALL.items():
        program = name.split(".")[0]
        if program not in OWN:
            continue
        for target, module_level in imports(name, path):
            first = target.split(".")[0]
            if first not in {p for _, _, p in GRAPHED} or first in OWN[program]:
                continue
            if name == DISPATCHER and target in ("gpunode_rulepack.cli", "gpunode_report.cli") and not module_level:
                continue
            wrong.append(f"{name} imports {target}")
    assert not wrong


def test_each_program_imports_only_what_its_install_brings() -> None:
    wrong = [f"{module} imports {lib}, which its install does not bring"
             for program in PROGRAMS for module, libs in third_party(program).items()
             for lib in libs - installed_by(program)]
    assert not wrong


def test_the_node_agent_imports_none_of_the_other_programs_libraries() -> None:
    theirs = set().union(*(libs for program in ("gpunode_rulepack", "gpunode_report")
                           for libs in third_party(program).values()))
    ours = set().union(*third_party("gpunode_exporter").values())
    assert theirs - {"yaml"} and not ours & (theirs - {"yaml"}), ours & theirs
    assert {"jinja2", "numpy"} <= theirs  # the reading still sees their libraries


def test_no_benchmark_script_hides_a_package() -> None:
    # A script's directory comes first on sys.path: benchmarks/report.py would be `import report`.
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    assert not scripts & {p for _, _, p in GRAPHED}
