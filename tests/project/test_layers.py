"""The folders of src/gwpolicy are the layers of docs/architecture.md, and the imports keep to them.

The Layers table of docs/architecture.md names each layer (a folder, or the package's own files) and
the layers it may import; this test reads that table, so the map a reader sees is the rule the code
keeps. It fails on an import of a layer the table does not allow (an upward import), on an import
circle between modules (an import under `if TYPE_CHECKING:` loads nothing and is not one), on a module no layer holds, on a third-party import in a layer the table
limits to named packages, and on a use of another module's `_private` name. There is no list
of exceptions: a rule that needs one is a rule to change in the table.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "gwpolicy"
DOC = ROOT / "docs" / "architecture.md"


@dataclass
class Layer:
    name: str
    holds: list[str]  # folders ("engine/") or files of the package root ("compiled.py")
    may_import: set[str]
    third_party: set[str] | None  # the packages allowed; None: any


@dataclass
class Module:
    name: str  # gwpolicy.engine.refs
    path: Path
    imports: dict[str, int] = field(default_factory=dict)  # module imported -> first line
    loads: set[str] = field(default_factory=set)  # the modules of `imports` an import loads (not for types only)
    third_party: dict[str, int] = field(default_factory=dict)
    private: list[tuple[str, int]] = field(default_factory=list)  # "module._name", line


def _cell_names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def read_layers(text: str) -> list[Layer]:
    """The rows of the table under `## Layers`: | layer | holds | may import | third-party |."""
    section = text.split("\n## Layers\n", 1)
    assert len(section) == 2, f"{DOC.name} has no '## Layers' section"
    rows = []
    for line in section[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 4 or set(cells[0]) <= set("-: "):
            continue
        if cells[0].lower() == "layer":
            continue
        rows.append(Layer(name=cells[0].strip("`* "), holds=_cell_names(cells[1]),
                          may_import=set(_cell_names(cells[2])),
                          third_party=None if cells[3].lower() == "any" else set(_cell_names(cells[3]))))
    assert rows, f"the Layers table of {DOC.name} has no rows"
    return rows


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(name: str, known: set[str]) -> str | None:
    """The gwpolicy module an import names (the longest known prefix)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def read_modules() -> dict[str, Module]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p): Module(module_name(p), p) for p in paths}
    known = set(modules)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for mod in modules.values():
        tree = ast.parse(mod.path.read_text(), str(mod.path))
        aliases: dict[str, str] = {}  # local name -> gwpolicy module it is bound to
        typing_only = {id(n) for guard in ast.walk(tree) if isinstance(guard, ast.If) and _is_type_checking(guard.test)
                       for stmt in guard.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            targets: list[tuple[str, str | None, str | None]] = []  # (module, name imported, bound to)
            if isinstance(node, ast.Import):
                targets = [(a.name, None, a.asname) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = mod.name if mod.path.name == "__init__.py" else mod.name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}".rstrip(".")
                targets = [(base, a.name, a.asname or a.name) for a in node.names]
            for base, name, bound in targets:
                top = base.split(".")[0]
                if top != "gwpolicy":
                    if top not in stdlib:
                        mod.third_party.setdefault(top, node.lineno)
                    continue
                full = f"{base}.{name}" if name and f"{base}.{name}" in known else base
                target = _resolve(full, known)
                if target is None:
                    continue
                if target != mod.name:
                    mod.imports.setdefault(target, node.lineno)
                    if id(node) not in typing_only:
                        mod.loads.add(target)
                if name and full == base and name.startswith("_") and not name.startswith("__") \
                        and target != mod.name:
                    mod.private.append((f"{target}.{name}", node.lineno))
                if bound and (name is None or full != base):
                    aliases[bound] = target
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and aliases[node.value.id] != mod.name \
                    and f"{aliases[node.value.id]}.{node.attr}" not in known:
                mod.private.append((f"{aliases[node.value.id]}.{node.attr}", node.lineno))
    return modules


def layer_of(module: Module, layers: list[Layer]) -> Layer | None:
    rel = module.path.relative_to(PACKAGE).as_posix()
    for layer in layers:
        for held in layer.holds:
            if (held.endswith("/") and rel.startswith(held)) or rel == held:
                return layer
    return None


def circles(modules: dict[str, Module]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(modules[v].loads):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def layers() -> list[Layer]:
    return read_layers(DOC.read_text())


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    return read_modules()


def test_the_table_names_only_layers_it_defines(layers: list[Layer]) -> None:
    names = {layer.name for layer in layers}
    assert len(names) == len(layers), "a layer is named twice"
    for layer in layers:
        assert layer.may_import <= names, f"{layer.name} may import unknown layers {layer.may_import - names}"
        for held in layer.holds:
            assert (PACKAGE / held).exists(), f"layer {layer.name} holds {held}, which src/gwpolicy has not"


def test_every_module_lies_in_one_layer(layers: list[Layer], modules: dict[str, Module]) -> None:
    homeless = [m.path.relative_to(PACKAGE).as_posix() for m in modules.values() if layer_of(m, layers) is None]
    assert not homeless, f"no layer of {DOC.name} holds: {homeless}"


def test_no_module_imports_a_layer_its_own_may_not(layers: list[Layer], modules: dict[str, Module]) -> None:
    upward = []
    for mod in modules.values():
        own = layer_of(mod, layers)
        assert own is not None
        for target, line in sorted(mod.imports.items()):
            other = layer_of(modules[target], layers)
            assert other is not None
            if other is not own and other.name not in own.may_import:
                upward.append(f"{mod.path.relative_to(ROOT)}:{line}: {own.name} imports {target} ({other.name})")
        if own.third_party is not None:
            upward += [f"{mod.path.relative_to(ROOT)}:{line}: {own.name} imports {top} (the table allows "
                       f"{sorted(own.third_party) or 'the standard library only'})"
                       for top, line in sorted(mod.third_party.items()) if top not in own.third_party]
    assert not upward, "imports the Layers table does not allow:\n" + "\n".join(upward)


def test_no_import_circle(modules: dict[str, Module]) -> None:
    found = circles(modules)
    assert not found, "modules that import each other (directly or through others):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


def test_no_module_uses_another_modules_private_names(modules: dict[str, Module]) -> None:
    used = [f"{m.path.relative_to(ROOT)}:{line}: {name}" for m in modules.values() for name, line in m.private]
    assert not used, "private names used outside their module:\n" + "\n".join(sorted(used))


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The reading of the table and the circle search, on a small made-up case."""
    table = ("# A\n\n## Layers\n\n| layer | holds | may import | third-party |\n|---|---|---|---|\n"
             "| core | `core/` | | `orjson` |\n| top | `top/`, `main.py` | `core` | any |\n\n## Next\n| x | y | z | w |\n")
    got = read_layers(table)
    assert [(lay.name, lay.holds, lay.may_import, lay.third_party) for lay in got] == [
        ("core", ["core/"], set(), {"orjson"}), ("top", ["top/", "main.py"], {"core"}, None)]
    a, b, c = (Module(n, tmp_path / n) for n in "abc")
    a.loads, b.loads, c.loads = {"b"}, {"c"}, {"a"}
    assert circles({"a": a, "b": b, "c": c}) == [["a", "b", "c"]]
    c.loads = set()
    assert circles({"a": a, "b": b, "c": c}) == []
