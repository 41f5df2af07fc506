"""How big and how deep a client's JSON Schema may be, checked before any native library sees it.

llguidance (ours, and the one inside vLLM or TensorRT-LLM) and xgrammar compile a schema by recursion on the C
stack: once per nesting level and once more per `$ref` followed. A chain of ~3,000 `$ref`s, or a cycle of ~1,000
definitions that each nest a few levels, overflows an 8 MiB stack and kills the process (measured with llguidance
1.9: a chain of 2,000 links compiles, 3,000 crash; a cycle of 500 four-level definitions compiles, 1,000 crash).
So the longest path a compiler can walk, nesting levels plus `$ref` hops, is bounded here with a wide margin, in
one linear pass in Python, and so are the counts that make compiling slow (properties, alternatives, definitions).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

# The longest walk through a schema: nesting levels, plus REF_COST for each `$ref` followed. An 8 MiB stack
# overflowed near 7,000 of these units; 1,000 leaves a wide margin and far more than real schemas use (a
# recursive tree type costs tens; a DAG of 50 definitions rarely 200).
MAX_RESOLUTION_DEPTH = 1_000
REF_COST = 2
# OpenAI's own limit on structured outputs: 5,000 object properties in all.
MAX_PROPERTIES = 5_000
# Alternatives (anyOf, oneOf, allOf, prefixItems entries) in all, and definitions ($defs, definitions).
MAX_ALTERNATIVES = 1_000
MAX_DEFINITIONS = 1_000

_ALTERNATIVES = ("anyOf", "oneOf", "allOf", "prefixItems")
_DEFINITIONS = ("$defs", "definitions")
_PROPERTIES = ("properties", "patternProperties")

Path = tuple[str, ...]


def schema_bounds_error(schema: Any) -> str | None:
    """Why a schema is too large or too deep to compile safely; None when it is within the bounds."""
    counts = {"properties": 0, "alternatives": 0, "definitions": 0}
    refs: list[tuple[Path, str]] = []  # (where the $ref is, its value)
    anchors: dict[str, Path] = {}
    stack: list[tuple[Path, Any]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, list):
            stack += [((*path, str(index)), item) for index, item in enumerate(node)]
            continue
        if not isinstance(node, dict):
            continue
        for keyword, value in node.items():
            if keyword in _PROPERTIES and isinstance(value, dict):
                counts["properties"] += len(value)
            elif keyword in _ALTERNATIVES and isinstance(value, list):
                counts["alternatives"] += len(value)
            elif keyword in _DEFINITIONS and isinstance(value, dict):
                counts["definitions"] += len(value)
            elif keyword in ("$ref", "$dynamicRef") and isinstance(value, str):
                refs.append((path, value))
            elif keyword == "$anchor" and isinstance(value, str):
                anchors.setdefault(value, path)
            if isinstance(value, (dict, list)):
                stack.append(((*path, keyword), value))
    if counts["properties"] > MAX_PROPERTIES:
        return f"it has more than {MAX_PROPERTIES} properties in all"
    if counts["alternatives"] > MAX_ALTERNATIVES:
        return f"it has more than {MAX_ALTERNATIVES} alternatives (anyOf, oneOf, allOf, prefixItems) in all"
    if counts["definitions"] > MAX_DEFINITIONS:
        return f"it has more than {MAX_DEFINITIONS} definitions"
    if refs and _resolution_depth(schema, refs, anchors) > MAX_RESOLUTION_DEPTH:
        return (f"its references nest too deeply (over {MAX_RESOLUTION_DEPTH} levels of nesting and `$ref` "
                "resolution on one path); use fewer chained definitions")
    return None


def _resolution_depth(schema: Any, refs: list[tuple[Path, str]], anchors: dict[str, Path]) -> int:
    """An upper bound of the longest walk a recursive compiler takes from the root, in nesting levels and REF_COST
    per `$ref`.

    The schema is cut into units: the root and every node a `$ref` names. A unit's weight is its own height (not
    counting the units nested in it) plus REF_COST; an edge leads from a unit to each unit its `$ref`s name and to
    each unit nested in it. A walk visits a unit at most once per path (compilers stop at a definition already being
    compiled), so the heaviest path is bounded by the heaviest path over the graph's strongly connected components,
    each weighing the sum of its units."""
    targets = {path: target for path, value in refs if (target := _target(value, anchors)) is not None}
    units = {()} | set(targets.values())
    height: dict[Path, int] = defaultdict(int)
    edges: dict[Path, set[Path]] = defaultdict(set)
    stack: list[tuple[Path, Any, Path, int]] = [((), schema, (), 1)]
    while stack:
        path, node, unit, depth = stack.pop()
        if path in units and path != unit:
            edges[unit].add(path)
            unit, depth = path, 1
        height[unit] = max(height[unit], depth)
        if path in targets:
            edges[unit].add(targets[path])
        children = (node.items() if isinstance(node, dict) else
                    ((str(index), item) for index, item in enumerate(node)) if isinstance(node, list) else ())
        for key, child in children:
            if isinstance(child, (dict, list)):
                stack.append(((*path, key), child, unit, depth + 1))
    weight = {unit: height[unit] + REF_COST for unit in units}
    return _heaviest_path((), edges, weight)


def _target(ref: str, anchors: dict[str, Path]) -> Path | None:
    """The path a local reference names (`#`, `#/json/pointer` or `#anchor`); None for anything else."""
    if ref == "#" or ref == "#/":
        return ()
    if ref.startswith("#/"):
        return tuple(part.replace("~1", "/").replace("~0", "~") for part in ref[2:].split("/"))
    if ref.startswith("#"):
        return anchors.get(ref[1:])
    return None


def _heaviest_path(start: Path, edges: dict[Path, set[Path]], weight: dict[Path, int]) -> int:
    """The heaviest path from `start`, where a strongly connected component weighs the sum of its nodes (Tarjan's
    algorithm, iterative: the graph is the client's)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    component_of: dict[Path, int] = {}
    components: list[list[Path]] = []
    on_stack: set[Path] = set()
    tarjan: list[Path] = []
    work: list[tuple[Path, list[Path]]] = [(start, list(edges[start]))]
    index[start] = low[start] = 0
    tarjan.append(start)
    on_stack.add(start)
    while work:
        node, pending = work[-1]
        if pending:
            child = pending.pop()
            if child not in weight:  # a $ref to nothing: refused elsewhere (unresolved_ref)
                continue
            if child not in index:
                index[child] = low[child] = len(index)
                tarjan.append(child)
                on_stack.add(child)
                work.append((child, list(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
            continue
        work.pop()
        if work:
            parent = work[-1][0]
            low[parent] = min(low[parent], low[node])
        if low[node] == index[node]:
            members = []
            while True:
                member = tarjan.pop()
                on_stack.discard(member)
                component_of[member] = len(components)
                members.append(member)
                if member == node:
                    break
            components.append(members)
    # Tarjan's algorithm finds components in reverse topological order: successors first.
    heaviest: list[int] = []
    for number, members in enumerate(components):
        below = max((heaviest[component_of[child]] for member in members for child in edges[member]
                     if child in component_of and component_of[child] != number), default=0)
        heaviest.append(sum(weight[member] for member in members) + below)
    return heaviest[component_of[start]]
