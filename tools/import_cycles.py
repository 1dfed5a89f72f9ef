"""The project's import-graph check (`make lint`): no module circles and no package circles, except
the ones listed with a reason in tools/import_cycles_allowed.txt, and no import up a layer.

Edges come from the source (ast), not from importing it: every `import` and `from ... import` of a
first-party module counts, at module level or inside a function (a function-level import hides a
cycle, it does not remove it). Imports under `if TYPE_CHECKING:` do not count (they never run).
`from pkg import name` is an edge to `pkg.name` when that is a module, else to `pkg`.

Two graphs are checked: modules, and packages (a module `a.x.m` belongs to `a.x`; a top-level
module `a.config` is a package of its own). The allowlist names, one per line, the edge that closes a
known circle (the import that goes up a layer) with the reason it is still there:
    package prl_actors.records -> prl_actors.coordinator  # RunDir's eval sink imports the writer (...)
The check takes the allowed edges out and fails on every circle left (a strongly connected component,
shown with one path round it), and on an allowed edge that no longer exists (keep the list honest).
A new import that closes a circle through allowed edges still fails: only the listed edges are exempt.

Layers (tools/import_layers.txt, one line per layer, bottom to top): a package may import packages of
its own layer or below, never above; in an `isolated:` layer (the process folders) not its siblings
either; a package the file does not place fails too, so a new folder must be given its layer.

    python tools/import_cycles.py [--root DIR] [--allow FILE] [--layers FILE] [PACKAGE ...]   (default: prl_actors)
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

Graph = dict[str, set[str]]


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of `packages` under `root`: dotted name -> file (a package is its __init__.py)."""
    out = {}
    for package in packages:
        # os.walk follows links: prl_actors/cli is a link to the repository's cli/ (pyproject.toml)
        found = (Path(d) / f for d, _, fs in os.walk(root / package, followlinks=True) for f in fs)
        for path in sorted(p for p in found if p.suffix == ".py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: all of them, except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The first-party module `name` refers to: itself, else its longest known prefix (None: third party)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def edges_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The first-party modules `module` imports (itself excluded)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        out.update(t for t in (_resolve(t, modules) for t in targets) if t is not None and t != module)
    return out


def module_graph(root: Path, packages: Iterable[str]) -> Graph:
    modules = module_files(root, packages)
    return {m: edges_of(m, p, modules) for m, p in modules.items()}


def package_of(module: str) -> str:
    """`a.x.m` -> `a.x`; a top-level module `a.config` (or the root `a`) is its own package."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: Graph) -> Graph:
    out: Graph = {}
    for m, targets in graph.items():
        src = package_of(m)
        out.setdefault(src, set()).update(package_of(t) for t in targets)
        out[src].discard(src)
    return out


def components(graph: Graph) -> list[tuple[str, ...]]:
    """The strongly connected components with more than one member (Tarjan, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    members.append(m)
                    if m == node:
                        break
                if len(members) > 1:
                    found.append(tuple(sorted(members)))
    return sorted(found)


def shortest_cycle(graph: Graph, members: tuple[str, ...]) -> list[str]:
    """One short circle through the component's first member (for the error message)."""
    inside, first = set(members), members[0]
    paths = {first: [first]}
    frontier = [first]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child == first:
                    return [*paths[node], first]
                if child in inside and child not in paths:
                    paths[child] = [*paths[node], child]
                    nxt.append(child)
        frontier = nxt
    return list(members)


def read_allowed(path: Path) -> dict[tuple[str, str, str], str]:
    """(kind, importer, imported) -> reason, from lines `<kind> <importer> -> <imported>  # reason`.
    A line without a reason, or not of that form, is an error."""
    allowed = {}
    if not path.exists():
        return allowed
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        entry, _, reason = text.partition("#")
        kind, _, rest = entry.strip().partition(" ")
        src, arrow, dst = rest.partition("->")
        if kind not in ("module", "package") or not arrow or not reason.strip():
            raise SystemExit(f"{path}:{n}: expected '<module|package> <importer> -> <imported>  # reason'")
        allowed[(kind, src.strip(), dst.strip())] = reason.strip()
    return allowed


def _without(graph: Graph, kind: str, allowed: dict[tuple[str, str, str], str]) -> Graph:
    return {a: {b for b in bs if (kind, a, b) not in allowed} for a, bs in graph.items()}


def read_layers(path: Path) -> tuple[dict[str, int], set[int]]:
    """package -> its layer (0: the bottom), and the isolated layers, from `path` (one layer a line)."""
    layer_of: dict[str, int] = {}
    isolated: set[int] = set()
    if not path.exists():
        return layer_of, isolated
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    for n, line in enumerate(line for line in lines if line):
        if line.startswith("isolated:"):
            isolated.add(n)
            line = line.removeprefix("isolated:")
        for package in line.split():
            layer_of[package] = n
    return layer_of, isolated


def layer_problems(graph: Graph, layers: Path) -> list[str]:
    """Each package import that goes up a layer, or across an isolated one, and each package the
    layer file does not place (none when there is no layer file)."""
    layer_of, isolated = read_layers(layers)
    if not layer_of:
        return []
    problems = [f"package {p} has no layer in {layers.name}" for p in sorted(graph) if p not in layer_of]
    for a in sorted(graph):
        for b in sorted(graph[a]):
            la, lb = layer_of.get(a), layer_of.get(b)
            if la is None or lb is None or lb < la:
                continue
            if lb > la:
                problems.append(f"layer violation: {a} imports {b}, a higher layer ({layers.name})")
            elif la in isolated:
                problems.append(f"layer violation: {a} imports {b}, its sibling in an isolated layer ({layers.name})")
    return problems


def check(root: Path, packages: list[str], allow: Path, layers: Path | None = None) -> list[str]:
    """The problems: each circle left once the allowed edges are taken out (with one path round it),
    each allowed edge that no longer exists (keep the list honest), and with a layer file, each import
    that goes up a layer."""
    graph = module_graph(root, packages)
    graphs = {"module": graph, "package": package_graph(graph)}
    allowed = read_allowed(allow)
    problems = []
    for kind, g in graphs.items():
        rest = _without(g, kind, allowed)
        for members in components(rest):
            circle = " -> ".join(shortest_cycle(rest, members))
            problems.append(f"{kind} import cycle: {' <-> '.join(members)}\n    e.g. {circle}")
    for kind, a, b in allowed:
        if b not in graphs[kind].get(a, ()):
            problems.append(f"allowed import edge no longer exists (remove it from {allow.name}): {kind} {a} -> {b}")
        elif not _reaches(_without(graphs[kind], kind, allowed), b, a):  # needed on its own
            problems.append(f"allowed import edge closes no circle (remove it from {allow.name}): {kind} {a} -> {b}")
    if layers is not None:
        problems += layer_problems(graphs["package"], layers)
    return problems


def _reaches(graph: Graph, start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        for child in graph.get(node, ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return False


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", default=["prl_actors"])
    parser.add_argument("--root", type=Path, default=here.parent)
    parser.add_argument("--allow", type=Path, default=here / "import_cycles_allowed.txt")
    parser.add_argument("--layers", type=Path, default=here / "import_layers.txt")
    args = parser.parse_args(argv)
    problems = check(args.root, args.packages, args.allow, args.layers)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{len(problems)} import graph problem(s); see tools/import_cycles.py", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
