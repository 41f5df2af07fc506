"""The import graph of proxy/, parsers/ and tools/ follows the data path: no module imports, even under
TYPE_CHECKING or inside a function, one that imports it back, and nothing reaches back up the path
(HTTP proxy/ -> render parsers/, tools/ -> engine proxy/engines/ -> parser events parsers/ -> serializers)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proxy", "parsers", "tools")
# proxy/engines/ is below the HTTP layer: of proxy/ it imports only itself (no routes, serializers, state, errors).
ENGINE_MAY_IMPORT = ("proxy.engines",)


def modules() -> dict[str, Path]:
    """Every module under PACKAGES by dotted name (a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The modules of ours `name` imports, anywhere in it, each with the line of its first import."""

    def ours(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [ours(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # `from package import module` imports the module; `from module import name`, the module
            targets = [ours(f"{base}.{alias.name}") if f"{base}.{alias.name}" in known else ours(base)
                       for alias in node.names]
        for target in targets:
            if target is not None and target != name:
                found.setdefault(target, node.lineno)
    return found


def graph() -> dict[str, dict[str, int]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root, targets in edges.items():
        if root in index:
            continue
        work = [(root, iter(targets))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def upward(name: str, target: str) -> bool:
    """Whether importing `target` from `name` goes back up the data path."""
    top, other = name.split(".")[0], target.split(".")[0]
    if top == "tools":
        return other in ("parsers", "proxy")
    if top == "parsers":
        return other == "proxy"
    if name == "proxy.engines" or name.startswith("proxy.engines."):
        return other == "proxy" and not any(target == allowed or target.startswith(allowed + ".")
                                            for allowed in ENGINE_MAY_IMPORT)
    if within(name, "proxy.telemetry"):  # beside the path: it reads the record, never the APIs or the server
        return any(within(target, api) for api in (*APIS, "proxy.server"))
    if within(name, "proxy.store"):  # beside the APIs: it keeps their records and imports none of them
        return any(within(target, api) for api in (*APIS, "proxy.server"))
    if within(target, "proxy.server"):  # the process around everything: only the entry point starts it
        return not within(name, "proxy.server") and name != "proxy.__main__"
    return False


APIS = ("proxy.chat", "proxy.responses", "proxy.completions")


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_graph_is_read() -> None:
    edges = graph()
    # a module-level import, a TYPE_CHECKING one and a function-local one are all seen
    assert "parsers.events" in edges["proxy.generation"]
    assert "proxy.outcome" in edges["proxy.telemetry.request_record"]
    assert "proxy.store.postgres" in edges["proxy.server.startup"]  # imported where --store-url asks for it
    assert "proxy.server.cli" in edges["proxy.__main__"]
    assert any(target.startswith("tools.") for target in edges["parsers.render"])


def test_no_import_cycles() -> None:
    edges = graph()
    found = cycles(edges)
    described = ["; ".join(f"{name} -> {', '.join(sorted(set(edges[name]) & set(c)))}" for name in c) for c in found]
    assert not found, "import cycles:\n" + "\n".join(described)


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_nothing_imports_back_up_the_data_path() -> None:
    bad = [f"{name} imports {target} (line {line})" for name, targets in graph().items()
           for target, line in targets.items() if upward(name, target)]
    assert not bad, "\n".join(bad)
