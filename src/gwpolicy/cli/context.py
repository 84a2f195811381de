"""What every command gets: the analysis, the namespace in scope, output format and style."""

from __future__ import annotations

from dataclasses import dataclass

from gwpolicy.analysis import Analysis
from gwpolicy.cli.printers import Style
from gwpolicy.refs import Ref


@dataclass
class Ctx:
    analysis: Analysis
    namespace: str  # the namespace of names given on the command line
    all_namespaces: bool
    output: str
    style: Style

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
