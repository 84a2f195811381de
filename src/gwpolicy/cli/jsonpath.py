"""kubectl's JSONPath dialect for `-o jsonpath=`, `-o custom-columns=` and `--sort-by`.

kubectl wraps JSONPath in a template: text with `{...}` actions, `{range EXPR}...{end}`, string
literals such as `{"\\n"}`, paths that start with `.` (the current object) and field names with
escaped dots (`gwpolicy\\.io/PolicyAffected`). The template layer is kubectl's and is written here;
each path is translated to standard JSONPath and evaluated by jsonpath-ng (filters, slices,
recursive descent, unions), a maintained library, rather than by a hand-written evaluator.
Printing follows kubectl: strings as they are, everything else as compact JSON with sorted keys,
several results of one action joined by a space, a missing field prints nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
from jsonpath_ng.ext import parse as _jp_parse


class JsonPathError(ValueError):
    """A template or path kubectl would refuse; the message quotes it and says what is wrong."""


# ---------------------------------------------------------------- paths


def _closing(text: str, start: int, opening: str, closing: str) -> int:
    """Index of the `closing` that ends the bracket opened just before `start` (nested brackets and
    quoted strings skipped); len(text) when there is none."""
    depth, quote, j = 1, "", start
    while j < len(text):
        ch = text[j]
        if quote:
            if ch == "\\":
                j += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == opening:
            depth += 1
        elif ch == closing:
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return len(text)


def _quote(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def translate(expr: str) -> tuple[str, bool]:
    """kubectl path -> (jsonpath-ng text, from the root): `.a.b\\.c[0]` -> `$."a"."b.c"[0]`.

    A path that starts with `$` reads the whole document; one that starts with `.` or `@` (or a
    bare name, as custom columns allow) reads the current object.
    """
    text = expr.strip()
    from_root = text.startswith("$")
    if text.startswith(("$", "@")):
        text = text[1:]
    out = ["$"]
    i = 0
    if text and text[0] not in ".[":
        text = "." + text  # `metadata.name`, as custom-columns and --sort-by take it
    while i < len(text):
        c = text[i]
        if c == "[":
            j = _closing(text, i + 1, "[", "]")
            if j >= len(text):
                raise JsonPathError(f"unclosed '[' in {expr!r}")
            out.append(text[i:j + 1])
            i = j + 1
        elif c == ".":
            if text.startswith("..", i):
                out.append("..")
                i += 2
            else:
                i += 1
            if i < len(text) and text[i] == "*":
                out.append("." + "*" if out[-1] != ".." else "*")
                i += 1
                continue
            name = []
            while i < len(text) and text[i] not in ".[":
                if text[i] == "\\" and i + 1 < len(text):
                    i += 1
                name.append(text[i])
                i += 1
            if name:
                out.append(("" if out[-1] == ".." else ".") + _quote("".join(name)))
            elif out[-1] != "..":
                if i < len(text) and text[i] == "[":
                    continue  # `.[0]`
                if i < len(text):
                    raise JsonPathError(f"empty field name in {expr!r}")
        else:
            raise JsonPathError(f"unexpected {c!r} in {expr!r}")
    return "".join(out), from_root


@lru_cache(maxsize=256)
def _compiled(expr: str) -> tuple[Any, bool]:
    text, from_root = translate(expr)
    try:
        return _jp_parse(text), from_root
    except (JsonPathLexerError, JsonPathParserError, Exception) as exc:  # noqa: BLE001 - the library raises plain Exception too
        raise JsonPathError(f"cannot parse {expr!r}: {exc}") from None


def find(expr: str, current: Any, root: Any | None = None) -> list[Any]:
    """Values the path selects (none when a field is missing, as kubectl's get allows)."""
    path, from_root = _compiled(expr)
    doc = root if from_root and root is not None else current
    if expr.strip() in ("", ".", "@", "$"):
        return [doc]
    try:
        return [m.value for m in path.find(doc)]
    except Exception as exc:  # noqa: BLE001 - e.g. a filter comparing a number with a string
        raise JsonPathError(f"cannot evaluate {expr!r}: {exc}") from None


# ---------------------------------------------------------------- templates


@dataclass
class _Node:
    kind: str  # "text", "path", "range"
    value: str = ""
    body: list["_Node"] = field(default_factory=list)


def _split_actions(template: str) -> list[tuple[bool, str]]:
    """(is_action, text) pieces: `a{.b}c` -> (False, a), (True, .b), (False, c)."""
    pieces: list[tuple[bool, str]] = []
    i, start = 0, 0
    while i < len(template):
        if template[i] == "{":
            if i > start:
                pieces.append((False, template[start:i]))
            j = _closing(template, i + 1, "{", "}")
            if j >= len(template):
                raise JsonPathError(f"unclosed action in {template!r}: a '{{' has no '}}'")
            pieces.append((True, template[i + 1:j]))
            i = start = j + 1
        else:
            i += 1
    if start < len(template):
        pieces.append((False, template[start:]))
    return pieces


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def _literal(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), body)


@dataclass(frozen=True)
class Template:
    """A parsed kubectl JSONPath template."""

    source: str
    nodes: tuple[_Node, ...]

    def render(self, doc: Any) -> str:
        out: list[str] = []
        _render(self.nodes, doc, doc, out)
        return "".join(out)


def unquote(template: str) -> str:
    """`jsonpath='{.a}'` as a CI file or a Windows shell leaves it keeps its quotes: kubectl drops them."""
    if len(template) >= 2 and template[0] == template[-1] and template[0] in "'\"":
        return template[1:-1]
    return template


def parse_template(template: str) -> Template:
    stack: list[list[_Node]] = [[]]
    for is_action, text in _split_actions(template):
        if not is_action:
            stack[-1].append(_Node("text", text))
            continue
        action = text.strip()
        if action == "end":
            if len(stack) == 1:
                raise JsonPathError(f"{{end}} without {{range}} in {template!r}")
            body = stack.pop()
            stack[-1][-1].body = body
        elif re.match(r"range(?![A-Za-z0-9_-])", action):  # `{range .items[*]}`, also `{range.items[*]}`
            expr = action[5:].strip()
            if not expr:
                raise JsonPathError(f"{{range}} needs a path in {template!r}")
            _compiled(expr)
            stack[-1].append(_Node("range", expr))
            stack.append([])
        elif len(action) >= 2 and action[0] == action[-1] and action[0] in "'\"":
            stack[-1].append(_Node("text", _literal(action)))
        elif action:
            _compiled(action)
            stack[-1].append(_Node("path", action))
    if len(stack) != 1:
        raise JsonPathError(f"{{range}} without {{end}} in {template!r}")
    return Template(template, tuple(stack[0]))


def text_of(value: Any) -> str:
    """kubectl's printing of one result: strings as they are, the rest as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _render(nodes: Sequence[_Node], current: Any, root: Any, out: list[str]) -> None:
    for node in nodes:
        if node.kind == "text":
            out.append(node.value)
        elif node.kind == "path":
            out.append(" ".join(text_of(v) for v in find(node.value, current, root)))
        else:
            for item in find(node.value, current, root):
                _render(node.body, item, root, out)


# ---------------------------------------------------------------- custom columns and --sort-by


def relaxed(expr: str) -> str:
    """kubectl's relaxed path of custom columns and --sort-by: `{.a}`, `.a` and `a` are one path."""
    text = expr.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if not text:
        raise JsonPathError(f"empty path {expr!r}")
    return text


@dataclass(frozen=True)
class Column:
    header: str
    path: str


def parse_columns(spec: str) -> list[Column]:
    """`NAME:.metadata.name,APP:.metadata.labels.app` -> columns."""
    cols = []
    for part in spec.split(","):
        header, sep, path = part.partition(":")
        if not sep or not header:
            raise JsonPathError(f"unexpected custom-columns spec {part!r}, expected <header>:<json-path-expr>")
        cols.append(Column(header, relaxed(path)))
        _compiled(cols[-1].path)
    if not cols:
        raise JsonPathError("custom-columns needs at least one <header>:<json-path-expr>")
    return cols


def go_text(value: Any) -> str:
    """A value as Go's fmt.Sprint prints it, as kubectl's custom columns show it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "<nil>"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_text(v)}" for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_text(v) for v in value) + "]"
    return str(value)


def column_cell(col: Column, obj: Any) -> str:
    values = find(col.path, obj, obj)
    return ",".join(go_text(v) for v in values) if values else "<none>"


def sort_key(path: str, obj: Any) -> tuple[Any, ...]:
    """Objects without the field first, then numbers, then strings (as kubectl compares them: by
    code point, `web-10` before `web-9`), then the rest as JSON."""
    values = find(path, obj, obj)
    if not values or values[0] is None:
        return (0,)
    v = values[0]
    if isinstance(v, bool):
        return (1, int(v))
    if isinstance(v, (int, float)):
        return (2, v)
    if isinstance(v, str):
        return (3, v)
    return (3, str(v)) if not isinstance(v, (dict, list)) else (4, text_of(v))  # a YAML timestamp sorts as its text
