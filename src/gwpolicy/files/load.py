"""Reading manifests (edge): files, directories, stdin; YAML (C loader) and JSON; `List` kinds.

A malformed file is a `LoadError` naming `file:line` (a duplicate key, too, as kubectl refuses
it: the object and the key are named); an object that lacks
apiVersion/kind/metadata.name is reported as a warning by position and skipped.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable

import yaml

from gwpolicy.files import yamlfast

try:  # the C loader is several times faster; fall back to the pure one where libyaml is missing
    _SafeLoader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on the build of PyYAML
    _SafeLoader = yaml.SafeLoader

_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A mapping that names one key twice. PyYAML keeps the last; kubectl refuses the manifest
    (docs/architecture.md, "Reading YAML"), and so does this loader."""

    def __init__(self, key: Any, first: yaml.Node, again: yaml.Node, mapping: yaml.Node,
                 document: yaml.Node | None) -> None:
        super().__init__("while constructing a mapping", first.start_mark, f"found duplicate key {key!r}",
                         again.start_mark)
        self.key, self.first, self.again, self.mapping, self.document = key, first, again, mapping, document


class AliasBombError(yaml.MarkedYAMLError):
    """A document whose aliases would expand it far beyond what was written (a "billion laughs")."""

    def __init__(self, node: yaml.Node, expanded: float, written: int) -> None:
        what = "an alias that contains itself" if expanded == float("inf") else \
            f"its aliases expand {written:,} written nodes to {int(expanded):,}"
        super().__init__("while composing a document", node.start_mark,
                         f"{what}; refused, as kubectl refuses excessive aliasing", None)
        self.expanded, self.written = expanded, written


def _alias_ratio(expanded: float) -> float:
    """How much of a document may come from aliases: go-yaml's rule (what kubectl reads with):
    99% up to 400,000 nodes, falling to 10% at 4,000,000 and beyond."""
    if expanded <= 400_000:
        return 0.99
    if expanded >= 4_000_000:
        return 0.10
    return 0.99 - 0.89 * (expanded - 400_000) / 3_600_000


def check_aliases(node: yaml.Node) -> None:
    """Raise AliasBombError when the document rooted at `node` would hold many more nodes once
    its aliases are expanded than were written (each node counted once per place it appears;
    computed over the written nodes, so the check itself stays cheap)."""
    size: dict[int, float] = {}
    written = 0
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        n, done = stack.pop()
        key = id(n)
        children = ([v for pair in n.value for v in pair] if isinstance(n, yaml.MappingNode)
                    else list(n.value) if isinstance(n, yaml.SequenceNode) else [])
        if done:
            size[key] = 1 + sum(size.get(id(c), float("inf")) for c in children)
            continue
        if key in size:
            continue
        size[key] = float("inf")  # while its children are counted: a node that contains itself stays infinite
        written += 1
        stack.append((n, True))
        stack.extend((c, False) for c in children if id(c) not in size)
    expanded = size[id(node)]
    aliased = expanded - written
    if expanded == float("inf") or (aliased > 100 and expanded > 1000 and aliased / expanded > _alias_ratio(expanded)):
        raise AliasBombError(node, expanded, written)


class BoundedLoader(_SafeLoader):
    """PyYAML's safe loader that refuses an alias bomb (check_aliases) before building anything."""

    def construct_document(self, node: yaml.Node) -> Any:
        check_aliases(node)
        return super().construct_document(node)


class _Loader(BoundedLoader):
    """PyYAML's safe loader that refuses a duplicate key in a mapping instead of keeping the last.

    Keys are compared as PyYAML constructs them, by type and value (`a` and `"a"` are one key,
    `1` and `"1"` two, as in go-yaml). A key given again by a merge (`<<`) is an override, not a
    duplicate (YAML's merge key type).
    """

    _document: yaml.Node | None = None

    def construct_document(self, node: yaml.Node) -> Any:
        self._document = node
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode) and len(node.value) > 1 and self._may_repeat(node.value):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                tag = key_node.tag
                if tag == _STR_TAG and isinstance(key_node, yaml.ScalarNode):
                    key: Any = key_node.value
                elif tag == _MERGE_TAG:
                    continue
                else:
                    value = self.construct_object(key_node)  # kept: constructing the mapping reuses it
                    try:
                        key = (type(value), value)
                        hash(key)
                    except TypeError:
                        continue  # an unhashable key: PyYAML's own error follows
                first = seen.setdefault(key, key_node)
                if first is not key_node:
                    raise DuplicateKeyError(key if isinstance(key, str) else key[1], first, key_node, node,
                                            self._document)
        return super().construct_mapping(node, deep=deep)

    @staticmethod
    def _may_repeat(pairs: list[tuple[yaml.Node, yaml.Node]]) -> bool:
        """False when every key is a string (the common case) and no two are written alike."""
        # (a collection's value is a list); every concrete node class has an `id`, which `Node` does not declare
        if any(k.tag != _STR_TAG or k.id != "scalar" for k, _ in pairs):  # type: ignore[attr-defined]
            return True
        return len({k.value for k, _ in pairs}) < len(pairs)

_SUFFIXES = (".yaml", ".yml", ".json")
_FAST_FROM = 64 * 1024  # below this, PyYAML's time is not worth a second reader
_DOC_SEP = re.compile(r"\n---")  # a literal first: re finds it by a fast search, `^` would try every position


class LoadError(Exception):
    """A file that cannot be read or parsed; the message starts with `file:line:`."""


@dataclass
class Loaded:
    """What the loader produced: objects in input order, where each came from, and warnings."""

    objects: list[dict[str, Any]] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def expand_paths(paths: Iterable[str]) -> list[str]:
    """Files named, and files below directories (recursively, sorted); `-` is stdin."""
    out: list[str] = []
    for p in paths:
        if p == "-":
            out.append(p)
        elif os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for f in files:
                    if f.endswith(_SUFFIXES):
                        found.append(os.path.join(root, f))
            out.extend(sorted(found))
        elif os.path.exists(p):
            out.append(p)
        else:
            raise LoadError(f"{p}: no such file or directory")
    return out


def load_paths(paths: Iterable[str], stdin_text: str | None = None) -> Loaded:
    """Load every file (stdin for `-`) into one `Loaded`."""
    result = Loaded()
    for path in expand_paths(paths):
        if path == "-":
            text = stdin_text if stdin_text is not None else sys.stdin.read()
            name = "<stdin>"
        else:
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise LoadError(f"{path}:1: cannot read: {exc}") from exc
            name = path
        load_text(text, name, result)
    return result


def load_text(text: str, name: str, into: Loaded | None = None) -> Loaded:
    """Parse one file's text (YAML or JSON) and append its objects to `into`."""
    into = into if into is not None else Loaded()
    stripped = text.lstrip()
    if name.endswith(".json") or stripped.startswith(("{", "[")):
        try:
            doc = json.loads(text, object_pairs_hook=_unique_pairs)
        except _RepeatedJSONKey as exc:
            raise LoadError(_duplicate_json_key(text, name, exc.key)) from exc
        except json.JSONDecodeError as exc:
            if name.endswith(".json"):
                raise LoadError(f"{name}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
            docs = _load_yaml(text, name)  # YAML flow style also starts with { or [
        except (RecursionError, ValueError) as exc:
            if name.endswith(".json"):
                raise LoadError(_beyond_limits(text, name, "JSON", exc)) from exc
            docs = _load_yaml(text, name)
        else:
            docs = doc if isinstance(doc, list) else [doc]
    else:
        docs = _load_yaml(text, name)
    starts: list[int] | None = None
    for index, doc in enumerate(docs):
        if doc is None:
            continue
        if starts is None:
            starts = _doc_start_lines(text)
        where = f"{name}:{starts[index] if index < len(starts) else 1}"
        if not isinstance(doc, dict):
            into.warnings.append(f"{where}: document {index + 1} is not an object; skipped")
            continue
        kind = doc.get("kind")
        items = doc.get("items")
        if isinstance(kind, str) and kind.endswith("List") and isinstance(items, list):
            for i, item in enumerate(items):
                _add(into, item, f"{where}: {kind} items[{i}]")
            continue
        _add(into, doc, where)
    return into


def _load_yaml(text: str, name: str) -> list[Any]:
    if len(text) >= _FAST_FROM:  # rapidyaml where it reads exactly as PyYAML does (yamlfast)
        docs = yamlfast.load_all(text)
        if docs is not None:
            return docs
    try:
        return list(yaml.load_all(text, Loader=_Loader))
    except DuplicateKeyError as exc:
        raise LoadError(_duplicate_key(exc, name)) from exc
    except AliasBombError as exc:
        raise LoadError(f"{name}:{exc.problem_mark.line + 1 if exc.problem_mark else 1}: invalid YAML: {exc.problem}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        what = f"{context}: {problem}" if context else problem
        raise LoadError(f"{name}:{line}: invalid YAML: {what}") from exc
    except (RecursionError, ValueError) as exc:
        raise LoadError(_beyond_limits(text, name, "YAML", exc)) from exc


class _RepeatedJSONKey(Exception):
    """A JSON object with a key twice (Python's json keeps the last; kubectl refuses it)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedJSONKey(key)
            seen.add(key)
    return obj


def _duplicate_json_key(text: str, name: str, key: str) -> str:
    """The message for a JSON duplicate: JSON is YAML's flow style, so PyYAML's marks name the
    lines and the object; where PyYAML cannot read the text (an escape YAML lacks), the key alone."""
    try:
        list(yaml.load_all(text, Loader=_Loader))
    except DuplicateKeyError as exc:
        return _duplicate_key(exc, name, "JSON")
    except (yaml.YAMLError, ValueError, RecursionError):
        pass
    return f'{name}:1: invalid JSON: duplicate key "{key}"; kubectl refuses a manifest with a duplicate key too'


def _duplicate_key(exc: DuplicateKeyError, name: str, syntax: str = "YAML") -> str:
    """`file:line: ... duplicate key "k" at spec.rules[0].k in Kind ns/name (first at line N)`."""
    where = _path_to(exc.document, exc.mapping) if exc.document is not None else None
    path: list[str | int] = where[1] if where else []
    obj = where[0] if where else None
    field = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(path))
    key = exc.key if isinstance(exc.key, str) else _scalar(exc.again)
    field = f"{field}.{key}" if field else str(key)
    what = _object_label(obj) if obj is not None else None
    return (f'{name}:{exc.again.start_mark.line + 1}: invalid {syntax}: duplicate key "{key}" at {field}'
            + (f" in {what}" if what else "") + f" (first at line {exc.first.start_mark.line + 1}); "
            "kubectl refuses a manifest with a duplicate key too")


def _path_to(root: yaml.Node, target: yaml.Node) -> tuple[yaml.Node, list[str | int]] | None:
    """The object (root, or the `List` item) holding `target`, and the path from it down to `target`."""
    stack: list[tuple[yaml.Node, list[str | int]]] = [(root, [])]
    while stack:
        node, path = stack.pop()
        if node is target:
            if len(path) >= 2 and path[0] == "items" and isinstance(path[1], int):  # an item of a `kind: List`
                return _child(root, path[:2]), path[2:]
            return root, path
        if isinstance(node, yaml.MappingNode):
            stack += [(v, path + [_scalar(k)]) for k, v in node.value]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(v, path + [i]) for i, v in enumerate(node.value)]
    return None


def _child(node: yaml.Node, path: list[str | int]) -> yaml.Node:
    for step in path:
        if isinstance(step, int):
            node = node.value[step]
        else:
            node = next(v for k, v in node.value if _scalar(k) == step)
    return node


def _scalar(node: yaml.Node) -> str:
    return node.value if isinstance(node, yaml.ScalarNode) else "?"


def _object_label(node: yaml.Node) -> str | None:
    """`HTTPRoute baker/cake`, from the raw nodes of an object (the first of each key)."""
    if not isinstance(node, yaml.MappingNode):
        return None

    def get(n: yaml.Node, key: str) -> yaml.Node | None:
        if isinstance(n, yaml.MappingNode):
            return next((v for k, v in n.value if _scalar(k) == key), None)
        return None

    kind, meta = get(node, "kind"), get(node, "metadata")
    ns, nm = (get(meta, "namespace"), get(meta, "name")) if meta is not None else (None, None)
    if not isinstance(kind, yaml.ScalarNode) or not isinstance(nm, yaml.ScalarNode):
        return None
    return f"{kind.value} " + (f"{ns.value}/" if isinstance(ns, yaml.ScalarNode) else "") + nm.value


_LONG_INT = re.compile(r"[0-9]{4301,}")


def _beyond_limits(text: str, name: str, syntax: str, exc: Exception) -> str:
    """The message for a document the parser gave up on: too deep, or an integer too long to read."""
    if isinstance(exc, RecursionError):
        return f"{name}:1: invalid {syntax}: nested too deeply to read (a Kubernetes object nests a few dozen levels)"
    long_int = _LONG_INT.search(text)
    if long_int is not None:
        line = text.count("\n", 0, long_int.start()) + 1
        return (f"{name}:{line}: invalid {syntax}: an integer of {long_int.end() - long_int.start()} digits; "
                "JSON holds integers of 64 bits")
    return f"{name}:1: invalid {syntax}: {exc}"


def _doc_start_lines(text: str) -> list[int]:
    """First line of each YAML document, counted as PyYAML counts documents (one pass over the text)."""
    seps: list[int] = [1] if text.startswith("---") else []
    line, pos = 1, 0
    for m in _DOC_SEP.finditer(text):
        line += text.count("\n", pos, m.start() + 1)
        pos = m.start() + 1
        seps.append(line)
    first = _first_content_line(text)
    starts = [n + 1 for n in seps]  # the document's first line is the one after `---`
    if not seps or seps[0] != first:
        starts.insert(0, first)
    return starts


def _first_content_line(text: str) -> int:
    """Number of the first line that is neither blank nor a comment."""
    for chunk in (text[:65536], text):  # the head first: splitting a whole big file into lines costs
        for number, line in enumerate(chunk.splitlines(), 1):
            s = line.strip()
            if s and not s.startswith("#"):
                return number  # (a line the head cuts short starts as the whole line does)
        if len(chunk) == len(text):
            break
    return 1


def _add(into: Loaded, obj: Any, where: str) -> None:
    problem = check_object(obj)
    if problem:
        into.warnings.append(f"{where}: {problem}; skipped")
        return
    into.objects.append(obj)
    into.origins.append(where)


def check_object(obj: Any) -> str | None:
    """Why an object cannot be analysed, or None (apiVersion, kind and metadata.name are required)."""
    if type(obj) is dict:  # the common case first, without building a message (48k objects at 20k routes)
        api, kind, meta = obj.get("apiVersion"), obj.get("kind"), obj.get("metadata")
        if api and kind and type(api) is str and type(kind) is str and type(meta) is dict:
            name = meta.get("name")
            if name and type(name) is str:
                return None
    if not isinstance(obj, dict):
        return "item is not an object"
    missing = [f for f in ("apiVersion", "kind") if not isinstance(obj.get(f), str) or not obj.get(f)]
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta.get("name"):
        missing.append("metadata.name")
    if missing:
        kind = obj.get("kind") if isinstance(obj.get("kind"), str) else "object"
        return f"{kind} without {', '.join(missing)}"
    return None
