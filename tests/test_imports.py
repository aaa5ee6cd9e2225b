"""Module structure of ``synth``: no module uses another module's private (``_name``) names, and the
import graph among ``synth`` modules has no cycle (imports inside functions included)."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import synth


def _modules() -> dict[str, Path]:
    """Every module of the ``synth`` package, by dotted name, with its source file."""
    found = {"synth": Path(synth.__file__)}
    for info in pkgutil.walk_packages(synth.__path__, "synth."):
        spec = info.module_finder.find_spec(info.name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            found[info.name] = Path(spec.origin)
    return found


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """Absolute module of a ``from ... import`` (relative imports resolved against ``module``)."""
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, str | None, ast.AST]]:
    """(imported module, imported name or None, node) of every import in ``module``, at any depth."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out: list[tuple[str, str | None, ast.AST]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, None, node) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node, is_package)
            for alias in node.names:
                # ``from pkg import submodule`` imports the submodule
                sub = f"{source}.{alias.name}"
                out.append((sub, None, node) if sub in MODULES else (source, alias.name, node))
    return out


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_modules_are_found():
    assert "synth.synthesis.timing" in MODULES and "synth.synthesis.trees.method" in MODULES
    assert len(MODULES) > 30


def test_no_private_names_across_modules():
    bad = []
    for module in MODULES:
        tree = ast.parse(MODULES[module].read_text())
        aliases: dict[str, str] = {}   # local name -> synth module it is bound to
        for target, name, node in _imports(module):
            if target in MODULES and target != module:
                if name is not None and _is_private(name):
                    bad.append(f"{module}:{node.lineno} imports {target}.{name}")
                if name is None:
                    for alias in node.names:
                        local = alias.asname or (alias.name if isinstance(node, ast.ImportFrom)
                                                 else alias.name.split(".")[0])
                        aliases[local] = target if isinstance(node, ast.ImportFrom) or alias.asname else local
        for node in ast.walk(tree):
            # ``mod._name`` and ``pkg.mod._name`` on an imported synth module
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                chain = []
                value = node.value
                while isinstance(value, ast.Attribute):
                    chain.append(value.attr)
                    value = value.value
                if isinstance(value, ast.Name) and value.id in aliases:
                    target = ".".join([aliases[value.id], *reversed(chain)])
                    if target in MODULES and target != module:
                        bad.append(f"{module}:{node.lineno} uses {target}.{node.attr}")
    assert not bad, "\n".join(bad)


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for target, _, _ in _imports(module):
            # importing a.b.c runs a and a.b first
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                dep = ".".join(parts[:i])
                if dep in MODULES and dep != module and not module.startswith(dep + "."):
                    graph[module].add(dep)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (depth-first search), or None."""
    state: dict[str, int] = {}   # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)) is not None:
                return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)) is not None:
            return found
    return None


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_import_graph_has_no_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)
