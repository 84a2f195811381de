"""What every command gets: the analysis, the namespace in scope, output format and style."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import datetime, timezone

from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.mesh import MESH_CONTROLLER, RequestsFrom
from gwpolicy.engine.refs import Ref
from gwpolicy.engine.topology import PathNode
from gwpolicy.files.printers import Style


@dataclass
class Ctx:
    analysis: Analysis
    namespace: str  # the namespace of names given on the command line
    all_namespaces: bool
    output: str
    style: Style
    #: `--from NAMESPACE`: only the mesh paths that hold that namespace's requests (docs/mesh.md)
    requests_from: RequestsFrom | None = None

    def keeps(self, path: PathNode) -> bool:
        """Is the path shown: every path, or with --from the mesh paths of that namespace's requests."""
        return self.requests_from is None or self.requests_from.holds(path)

    def path_note(self, path: PathNode) -> str:
        """What --from makes of a path of `Namespace/*` it shows: it stands for the namespace."""
        rf = self.requests_from
        if rf is None or not rf.borrows(path):
            return ""
        return f"   (Namespace/* stands for {rf.namespace}: it has no mesh paths of its own here)"

    def in_scope(self, ref: Ref) -> bool:
        """kubectl's rule: namespaced objects of the namespace (all with -A), cluster-scoped ones always."""
        return self.all_namespaces or ref.namespace is None or ref.namespace == self.namespace

    def none_found(self) -> str:
        return "No resources found" + ("" if self.all_namespaces else f" in {self.namespace} namespace") + "."


def label(ref: Ref, home: str | None = None) -> str:
    """`Kind/namespace/name` (`Kind/name` when cluster-scoped), `#section` for a section.

    The one reference format of every command's output; `home` is accepted for callers that once
    shortened names of their own namespace, and no longer changes anything.
    """
    return str(ref)


def short(ref: Ref) -> str:
    """`ns/name` or `name`."""
    return f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name


def requests_from(a: Analysis, namespace: str) -> RequestsFrom:
    """`--from NAMESPACE` on an analysis; an error when the input turns no mesh on."""
    from gwpolicy.cli.loading import CliError

    if a.topology.mesh is None:
        raise CliError(f"--from {namespace}: the input has no XMesh of {MESH_CONTROLLER}, so it has no mesh paths "
                       "(requests from one namespace to a Service), and --from shows only those (docs/mesh.md)")
    return RequestsFrom(a.topology.mesh, namespace)


def from_words(namespace: str) -> str:
    """How a header names what `--from NAMESPACE` keeps."""
    return f"namespace {namespace}: its mesh paths only (those of Namespace/* where it has none of its own)"


def from_line(ctx: Ctx, namespace: str | None) -> str:
    """The line that says a table is about the requests of one namespace (--from)."""
    return "" if namespace is None else ctx.style.bold("Requests from") + f" {from_words(namespace)}\n\n"


def rfc3339_time(text: str) -> str:
    """`--now`: an RFC 3339 time with its zone, given back in UTC as `YYYY-MM-DDTHH:MM:SSZ` (what status
    holds); anything else is a usage error, never a string written into lastTransitionTime."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an RFC 3339 time, such as 2026-01-01T00:00:00Z") from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone; add Z (UTC) or an offset such as +02:00")
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def port_number(text: str) -> int:
    """A TCP port, 0 to 65535 (0: the system picks a free one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number: ports are 0 to 65535")
    return port


