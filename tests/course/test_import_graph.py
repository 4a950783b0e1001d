"""The package's modules import one another without a circle: each can be read, tested and changed from the
bottom up. The graph counts every import, at the top of a module or inside a function (a deferred import is
still a circle), except those under ``if TYPE_CHECKING:``, which never run.

``from gqa_flash.course import layout`` is an edge to the module ``gqa_flash.course.layout`` alone;
``from gqa_flash import flash_attention`` (a name, not a module) is an edge to the package ``gqa_flash``.
"""

import ast

from gqa_flash.course import layout

ROOT = layout.PACKAGE_DIR


def _module_name(path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree, modules):
    found = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                for a in child.names:
                    submodule = f"{child.module}.{a.name}"
                    found.add(submodule if submodule in modules else child.module)
            visit(child)

    visit(tree)
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    paths = [p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts]
    modules = {_module_name(p): p for p in paths}
    return {name: _imports(ast.parse(path.read_text()), modules) - {name} for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_the_package_has_no_import_circle():
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
