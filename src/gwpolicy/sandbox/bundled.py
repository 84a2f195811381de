"""(edge) The definitions a new sandbox starts with (`gwpolicy sandbox --crds`), so that a
Gateway, a route or a policy can be applied to it at once: the Gateway API CRDs of one channel
(`deploy/gateway-api/standard` or `experimental`, the release the project is tested against,
unchanged), gwpolicy's own CRDs (`deploy/10-policykind-crd.yaml`, `41`-`45`, `50`) and the
PolicyKinds of its policy kinds (`deploy/policykinds/`).

The files are 2.6 MB of YAML, 0.1 s for PyYAML's C loader; tests start many sandboxes, so the
parsed objects are kept as JSON in the user's cache directory (`$XDG_CACHE_HOME/gwpolicy`, else
`~/.cache/gwpolicy`), under a key made of the files' names, sizes and modification times: a
start after the first reads them back in a few milliseconds, and an edited file is parsed again.
A cache that cannot be read or written is passed over.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import orjson
import yaml

#: the checkout's deploy/ (this file is src/gwpolicy/sandbox/bundled.py)
DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
CHANNELS = ("standard", "experimental")
_OURS = ("10-policykind-crd.yaml", "41-timeoutpolicy.yaml", "42-retrypolicy.yaml", "43-clientsettingspolicy.yaml",
         "44-upstreamsettingspolicy.yaml", "45-ratelimitpolicy.yaml", "50-effectivepolicy-crd.yaml")
_KINDS = ("CustomResourceDefinition", "PolicyKind")  # what is taken of those files (not RBAC, not the VAP)
_FORMAT = b"1"  # bump when what is cached changes shape


class BundleMissing(Exception):
    """The deploy/ files are not where this installation expects them."""


def files(channel: str, deploy: Path | None = None) -> list[Path]:
    """The files a sandbox of this channel starts from, in the order their objects are created."""
    deploy = deploy or DEPLOY
    if channel not in CHANNELS:
        raise ValueError(f"unknown channel {channel!r} (choose one of {', '.join(CHANNELS)})")
    gateway_api = sorted((deploy / "gateway-api" / channel).glob("*.yaml"))
    ours = [deploy / name for name in _OURS] + sorted((deploy / "policykinds").glob("*.yaml"))
    missing = [p for p in ours if not p.is_file()]
    if not gateway_api or missing:
        raise BundleMissing(f"the CRDs a sandbox starts with are not in {deploy} (a checkout's deploy/ directory): "
                            f"{'missing ' + ', '.join(str(p) for p in missing) if missing else 'no ' + channel + ' channel'}"
                            "; start it with --crds none")
    return gateway_api + ours


def _key(paths: list[Path]) -> str:
    h = hashlib.sha256(_FORMAT)
    for p in paths:
        st = p.stat()
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gwpolicy"


def _parse(paths: list[Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in paths:
        for doc in yaml.load_all(p.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if isinstance(doc, dict) and doc.get("kind") in _KINDS:
                out.append(doc)
    crds = [d for d in out if d["kind"] == "CustomResourceDefinition"]
    return crds + [d for d in out if d["kind"] != "CustomResourceDefinition"]  # a kind's CRD before its objects


def objects(channel: str, deploy: Path | None = None) -> list[dict[str, Any]]:
    """The CRDs (first) and PolicyKinds of `channel`, fresh objects on every call (the caller may
    keep or change them)."""
    paths = files(channel, deploy)
    cached = cache_dir() / f"sandbox-{channel}-{_key(paths)}.json"
    try:
        loaded = orjson.loads(cached.read_bytes())
        if isinstance(loaded, list):
            return loaded
    except (OSError, orjson.JSONDecodeError):
        pass
    parsed = _parse(paths)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cached.parent, prefix=".sandbox-", delete=False) as tmp:
            tmp.write(orjson.dumps(parsed))
        os.replace(tmp.name, cached)  # whole or not at all, also with many sandboxes starting at once
        for old in cached.parent.glob(f"sandbox-{channel}-*.json"):
            if old != cached:
                old.unlink(missing_ok=True)
    except OSError:
        pass
    return parsed


def _names(crd: dict[str, Any]) -> set[str]:
    """What kubectl may call a CRD's objects by: its name, kind, plural (lower case)."""
    names = (crd.get("spec") or {}).get("names") or {}
    return {str(n).lower() for n in ((crd.get("metadata") or {}).get("name"), names.get("kind"), names.get("plural")) if n}


def preload(channel: str | None, given: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a sandbox starts with, in the order to create it (seed.ordered): the bundled objects of
    `channel` (None: none) and `given` (the objects of -f, with a CRD made up for each kind that
    neither has). A CRD of `given` wins over ours of the same name, and also of the same kind or
    plural in another group, so that kubectl's `get timeoutpolicies` finds the file's; a PolicyKind
    of ours goes with its CRD, and gives way to one of `given` of the same name."""
    from gwpolicy.sandbox.seed import ordered, synthesize_crds

    if channel is None:
        return ordered(given)
    ours = objects(channel)
    given = given + synthesize_crds(ours + given)
    taken: set[str] = set()
    for o in given:
        if o.get("kind") == "CustomResourceDefinition":
            taken |= _names(o)
    policykinds = {str((o.get("metadata") or {}).get("name")) for o in given if o.get("kind") == "PolicyKind"}
    dropped = {o["metadata"]["name"] for o in ours if o["kind"] == "CustomResourceDefinition" and _names(o) & taken}
    kept = [o for o in ours if o["metadata"]["name"] not in dropped
            and not (o["kind"] == "PolicyKind" and o["metadata"]["name"] in policykinds)]
    return ordered(kept + given)
