"""A real Kubernetes control plane on loopback for the live tests: etcd, kube-apiserver and (where a test
needs namespace deletion or garbage collection) kube-controller-manager, built by tools/kube/build.

One etcd per test run (a fresh data directory in the run's temporary folder); each `KubeApiServer` is a
cluster of its own, an API server on its own etcd key prefix, so a test starts from an empty cluster
as it does with `gwpolicy sandbox`. The API server is set up as a cluster's is: TLS with a CA made here,
an admin kubeconfig with a client certificate (O=system:masters), `--authorization-mode=Node,RBAC`,
ServiceAccount tokens signed with a key made here (TokenRequest API), the default admission plugins
(ValidatingAdmissionWebhook among them) and NodeRestriction, and an audit log of what the ServiceAccounts
of gwpolicy-system asked for, so a test can list what each process was refused.

Every process runs in a process group of its own and is killed with it when the test ends, when the run
ends (`shutdown`, called by conftest.py) and at interpreter exit, also after a failure.
"""

from __future__ import annotations

import atexit
import base64
import copy
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import httpx2 as httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gwpolicy.engine.kinds import split_api_version
from gwpolicy.kube import certs

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
BIN_DIR = Path(os.environ.get("GWPOLICY_KUBE_BIN") or ROOT / "tools" / "kube" / "bin")
PROGRAMS = ("etcd", "kube-apiserver", "kube-controller-manager")
#: the control plane's loopback network (etcd, API servers, controller managers; ports picked free)
ADDRESS = "127.0.60.1"
#: ClusterIPs are allocated from here: loopback, so nothing ever sends traffic off the machine
SERVICE_RANGE = "127.0.61.0/24"
ISSUER = "https://kubernetes.default.svc.cluster.local"
SYSTEM_NS = "gwpolicy-system"
STARTUP_TIMEOUT = 90.0

#: startup times, printed at the end of the run (conftest.py)
TIMINGS: dict[str, list[float]] = {}


def missing() -> str | None:
    """Why the real control plane cannot run on this machine, or None."""
    absent = [p for p in PROGRAMS if not (BIN_DIR / p).is_file()]
    if absent:
        return (f"no {', '.join(absent)} in {BIN_DIR}: tools/kube/build makes them (needs Go; "
                f"./dev test runs it)")
    return None


# ---------------------------------------------------------------- processes

_RUNNING: set[subprocess.Popen] = set()
_LOCK = threading.Lock()


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    """A process in a new process group (killed with its children), its output to `log`."""
    out = open(log, "ab")
    try:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    finally:
        out.close()
    with _LOCK:
        _RUNNING.add(proc)
    return proc


def _end(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    if proc is None:
        return
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(5)
    with _LOCK:
        _RUNNING.discard(proc)


@atexit.register
def _kill_all() -> None:
    for proc in list(_RUNNING):
        _end(proc, signal.SIGKILL)


def free_port(address: str = ADDRESS) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(True)[-n:])
    except OSError:
        return ""


def _wait(proc: subprocess.Popen, log: Path, ready, what: str, timeout: float = STARTUP_TIMEOUT) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{_tail(log)}")
        try:
            if ready():
                return time.monotonic() - t0
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready in {timeout:.0f}s:\n{_tail(log)}")


def _timed(what: str, seconds: float) -> None:
    TIMINGS.setdefault(what, []).append(seconds)


# ---------------------------------------------------------------- certificates and keys

def _client_cert(ca: certs.KeyPair, cn: str, groups: list[str]) -> certs.KeyPair:
    """A client certificate (CN = user, O = groups) signed by `ca`, as kube-apiserver reads them."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, None)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
                     + [x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    return certs.KeyPair(cert.public_bytes(serialization.Encoding.PEM),
                         key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))


class Keys:
    """The cluster CA, the API server's serving certificate, the admin's client certificate and the
    ServiceAccount token signing key, written under `folder`."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        ca = certs.make_ca("gwpolicy-test-kubernetes-ca")
        self.ca = folder / "ca.crt"
        self.ca.write_bytes(ca.cert_pem)
        self.serving = certs.write_pair(str(folder), "apiserver",
                                        certs.make_serving(ca, [ADDRESS, "localhost", "kubernetes.default.svc"]))
        self.admin = certs.write_pair(str(folder), "admin", _client_cert(ca, "gwpolicy-test-admin", ["system:masters"]))
        sa = ec.generate_private_key(ec.SECP256R1())
        self.sa_key = folder / "sa.key"
        self.sa_key.write_bytes(sa.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
        self.sa_pub = folder / "sa.pub"
        self.sa_pub.write_bytes(sa.public_key().public_bytes(serialization.Encoding.PEM,
                                                             serialization.PublicFormat.SubjectPublicKeyInfo))


def kubeconfig(path: Path, server: str, ca: Path, user: dict[str, Any], namespace: str = "default") -> Path:
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
           "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
           "users": [{"name": "test", "user": user}],
           "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": namespace}}]}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# ---------------------------------------------------------------- etcd

class Etcd:
    """One etcd for the whole run, in the run's temporary folder; every API server keeps its cluster
    under a prefix of its own."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.log = folder / "etcd.log"
        for _ in range(3):
            client, peer = free_port(), free_port()
            self.url = f"http://{ADDRESS}:{client}"
            peer_url = f"http://{ADDRESS}:{peer}"
            self.proc = _spawn([str(BIN_DIR / "etcd"), "--name", "gwpolicy-test", "--data-dir", str(folder / "data"),
                                "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                                "--initial-cluster", f"gwpolicy-test={peer_url}", "--log-level", "warn",
                                "--unsafe-no-fsync", "--quota-backend-bytes", str(4 << 30)], self.log)
            try:
                took = _wait(self.proc, self.log, lambda: httpx.get(self.url + "/health", timeout=1).json()["health"] == "true",
                             "etcd", 30)
            except RuntimeError:
                _end(self.proc)
                if "address already in use" in _tail(self.log):
                    continue  # a port taken between picking and binding: pick again
                raise
            _timed("etcd", took)
            return
        raise RuntimeError(f"etcd could not bind a port:\n{_tail(self.log)}")

    def stop(self) -> None:
        _end(self.proc)


_ETCD: Etcd | None = None
_RUN_FOLDER: Path | None = None


def _run_folder() -> Path:
    global _RUN_FOLDER
    if _RUN_FOLDER is None:
        import tempfile

        _RUN_FOLDER = Path(tempfile.mkdtemp(prefix="gwpolicy-kube-"))
    return _RUN_FOLDER


def etcd() -> Etcd:
    global _ETCD
    if _ETCD is None:
        _ETCD = Etcd(_run_folder() / "etcd")
    return _ETCD


#: called first by `shutdown` (the cluster made ahead is closed there)
BEFORE_SHUTDOWN: list = []


def cluster_folder() -> Path:
    """A folder of its own for the next cluster, in the run's folder."""
    return _run_folder() / f"cluster-{time.monotonic_ns()}"


def shutdown() -> None:
    """Stop etcd and anything still running, and remove the run's folder."""
    global _ETCD, _RUN_FOLDER
    for f in BEFORE_SHUTDOWN:
        f()
    _kill_all()
    if _ETCD is not None:
        _ETCD.stop()
        _ETCD = None
    if _RUN_FOLDER is not None:
        import shutil

        shutil.rmtree(_RUN_FOLDER, ignore_errors=True)
        _RUN_FOLDER = None


# ---------------------------------------------------------------- the API server

AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived", "ResponseStarted"],
                "rules": [{"level": "Metadata", "userGroups": [f"system:serviceaccounts:{SYSTEM_NS}"]},
                          {"level": "None"}]}

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


class KubeApiServer:
    """kube-apiserver on a fresh etcd prefix: an empty cluster. `kind` is "kube" (the sandbox's is
    "sandbox"); `kubeconfig` and `http` are the admin's; `identity(sa)` is a kubeconfig holding a
    ServiceAccount's token; `refused(sa)` what that ServiceAccount was refused."""

    kind = "kube"

    def __init__(self, folder: Path) -> None:
        self.etcd = etcd()
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.prefix = f"/gwpolicy-test-{os.getpid()}-{time.monotonic_ns()}"
        self.keys = Keys(folder / "pki")
        self.audit = folder / "audit.log"
        self.policy = folder / "audit-policy.yaml"
        self.policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self.log = folder / "kube-apiserver.log"
        self.proc: subprocess.Popen | None = None
        self.kcm: subprocess.Popen | None = None
        self.port = free_port()
        self.url = f"https://{ADDRESS}:{self.port}"
        self.kubeconfig = kubeconfig(folder / "admin.kubeconfig", self.url, self.keys.ca,
                                     {"client-certificate": self.keys.admin[0], "client-key": self.keys.admin[1]})
        self.http = self._client()
        self.cache = folder / "kubectl-cache"
        self._identities: dict[str, Path] = {}
        self.start()

    def _client(self) -> httpx.Client:
        """The admin's client: the cluster CA, the admin's certificate."""
        import ssl

        ctx = ssl.create_default_context(cafile=str(self.keys.ca))
        ctx.load_cert_chain(*self.keys.admin)
        return httpx.Client(base_url=self.url, verify=ctx, timeout=30)

    # ---------- life
    def _args(self) -> list[str]:
        k = self.keys
        return [str(BIN_DIR / "kube-apiserver"), f"--etcd-servers={self.etcd.url}", f"--etcd-prefix={self.prefix}",
                f"--bind-address={ADDRESS}", f"--secure-port={self.port}", f"--advertise-address={ADDRESS}",
                f"--cert-dir={self.folder / 'certs'}",
                f"--tls-cert-file={k.serving[0]}", f"--tls-private-key-file={k.serving[1]}",
                f"--client-ca-file={k.ca}", "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={ISSUER}", f"--api-audiences={ISSUER}",
                f"--service-account-key-file={k.sa_pub}", f"--service-account-signing-key-file={k.sa_key}",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--enable-admission-plugins=NodeRestriction",  # with the default plugins, as kubeadm sets it
                "--endpoint-reconciler-type=none",  # no `kubernetes` Service endpoints (loopback is not allowed there)
                f"--audit-log-path={self.audit}", f"--audit-policy-file={self.policy}", "--audit-log-format=json",
                "--audit-log-mode=blocking", "--profiling=false", "--v=1"]

    def start(self) -> None:
        for attempt in range(3):
            self.proc = _spawn(self._args(), self.log)
            try:
                took = _wait(self.proc, self.log, lambda: self.http.get("/readyz").status_code == 200, "kube-apiserver")
            except RuntimeError:
                _end(self.proc)
                if "address already in use" in _tail(self.log) and attempt < 2:
                    self._move(free_port())
                    continue
                raise
            _timed("kube-apiserver", took)
            return

    def _move(self, port: int) -> None:
        self.port = port
        self.url = f"https://{ADDRESS}:{port}"
        kubeconfig(self.kubeconfig, self.url, self.keys.ca,
                   {"client-certificate": self.keys.admin[0], "client-key": self.keys.admin[1]})
        self.http.close()
        self.http = self._client()
        for sa in list(self._identities):
            self._identities.pop(sa)

    def stop(self) -> None:
        """Stop the API server (etcd keeps the cluster)."""
        _end(self.proc)
        self.proc = None

    def restart(self) -> None:
        """The API server goes away and comes back on the same port, with the same etcd."""
        self.stop()
        self.start()

    def close(self) -> None:
        _end(self.kcm)
        self.kcm = None
        self.stop()
        self.http.close()

    def __enter__(self) -> "KubeApiServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def controller_manager(self) -> None:
        """kube-controller-manager with the controllers a cluster's API objects rely on: ClusterRole
        aggregation (deploy/'s roles are aggregated), namespace deletion (a namespace deleted empties
        and goes) and garbage collection (an object whose owners are gone is deleted; it reads the
        API's kinds when it starts and again every 30 s, so start it once the CRDs are in)."""
        if self.kcm is not None:
            return
        log = self.folder / "kube-controller-manager.log"
        port = free_port()
        self.kcm = _spawn([str(BIN_DIR / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
                           f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
                           "--controllers=clusterrole-aggregation-controller,namespace-controller,garbage-collector-controller",
                           "--leader-elect=false", f"--bind-address={ADDRESS}", f"--secure-port={port}",
                           f"--cert-dir={self.folder / 'kcm-certs'}", "--concurrent-gc-syncs=5", "--v=1"], log)

        def healthy() -> bool:
            return httpx.get(f"https://{ADDRESS}:{port}/healthz", verify=False, timeout=1).status_code == 200
        _timed("kube-controller-manager", _wait(self.kcm, log, healthy, "kube-controller-manager"))

    # ---------- clients
    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
        env = dict(os.environ, KUBECONFIG=str(kubeconfig or self.kubeconfig))
        out = subprocess.run(["kubectl", "--cache-dir", str(self.cache), *args], capture_output=True, text=True,
                             input=input, env=env, timeout=60)
        if check:
            assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
        return out

    def apply(self, objects: Iterable[dict[str, Any]], manager: str = "gwpolicy-test") -> list[dict[str, Any]]:
        """Server-side apply, CRDs first (each waited for until Established), then Namespaces, then the
        rest, with the status a manifest carries written to the status subresource afterwards."""
        return apply_objects(self.http, objects, manager)

    def identity(self, sa: str, namespace: str = SYSTEM_NS) -> Path:
        """A kubeconfig for ServiceAccount `namespace/sa`, with a token from the TokenRequest API (made
        once per cluster; the ServiceAccount must exist, as deploy/ makes it)."""
        key = f"{namespace}/{sa}"
        if key not in self._identities:
            r = self.http.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
                               json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                     "spec": {"audiences": [ISSUER], "expirationSeconds": 7200}})
            assert r.status_code == 201, f"TokenRequest for {key}: {r.status_code} {r.text}"
            token = r.json()["status"]["token"]
            self._identities[key] = kubeconfig(self.folder / f"{namespace}-{sa}.kubeconfig", self.url, self.keys.ca,
                                               {"token": token}, namespace)
        return self._identities[key]

    def audit_events(self, sa: str | None = None, namespace: str = SYSTEM_NS) -> list[dict[str, Any]]:
        """What the audit log holds of ServiceAccount `namespace/sa` (every one of gwpolicy-system's when None)."""
        user = f"system:serviceaccount:{namespace}:{sa}" if sa else None
        out = []
        try:
            text = self.audit.read_text()
        except FileNotFoundError:
            return []
        for line in text.splitlines():
            if not line.strip():
                continue
            ev = json.loads(line)
            if user is None or ev.get("user", {}).get("username") == user:
                out.append(ev)
        return out

    def refused(self, sa: str, namespace: str = SYSTEM_NS) -> list[str]:
        """Each request of that ServiceAccount answered 403, as `verb group/resource[/sub] ns/name`."""
        return sorted({describe(ev) for ev in self.audit_events(sa, namespace)
                       if (ev.get("responseStatus") or {}).get("code") == 403})

    def writes(self, sa: str | None = None, resources: set[str] | None = None, exclude: set[str] = frozenset({"leases"}),
               namespace: str = SYSTEM_NS) -> int:
        """Successful writes by that ServiceAccount (every gwpolicy-system one when None), Leases left out."""
        n = 0
        for ev in self.audit_events(sa, namespace):
            ref = ev.get("objectRef") or {}
            code = (ev.get("responseStatus") or {}).get("code", 0)
            if ev.get("verb") in WRITE_VERBS and code < 300 and ref.get("resource") not in exclude \
                    and (resources is None or ref.get("resource") in resources):
                n += 1
        return n

    def install_deploy(self, *files: str, policy_groups: Iterable[str] = ()) -> None:
        """deploy/'s namespace and RBAC and `files` of deploy/, with the roles of `policy_groups`
        (`policy_group_roles`); kube-controller-manager then fills in the aggregated ClusterRoles
        (waited for)."""
        objs = deploy_objects(*files) + [r for g in policy_groups for r in policy_group_roles(g)]
        self.apply(objs)
        self.controller_manager()
        aggregated = [o["metadata"]["name"] for o in objs if o["kind"] == "ClusterRole" and o.get("aggregationRule")]
        end = time.monotonic() + 30
        while aggregated and time.monotonic() < end:
            aggregated = [n for n in aggregated
                          if not self.http.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{n}").json().get("rules")]
            time.sleep(0.05)
        assert not aggregated, f"ClusterRoles not aggregated in 30s: {aggregated}"


def deploy_objects(*files: str) -> list[dict[str, Any]]:
    """deploy/'s namespace and RBAC, and the given files of deploy/, as `kubectl apply -f` reads them,
    less their Deployments (the tests run the processes themselves, as those ServiceAccounts)."""
    objs: list[dict[str, Any]] = []
    for name in ("00-namespace.yaml", "20-rbac.yaml", *files):
        objs += [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d and d.get("kind") != "Deployment"]
    return objs


def policy_group_roles(group: str) -> list[dict[str, Any]]:
    """The ClusterRoles deploy/'s comments tell a user to add for policy kinds of a group of their own
    (the parable's policy.acme.io): read them (controller, webhook, gateway) and write their status
    (controller, gateway), joined to each process' role by its aggregation label."""
    def role(component: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": f"gwpolicy-{component}-{group}",
                             "labels": {f"gwpolicy.io/aggregate-to-{component}": "true"}},
                "rules": rules}
    read = {"apiGroups": [group], "resources": ["*"], "verbs": ["get", "list", "watch"]}
    status = {"apiGroups": [group], "resources": ["*/status"], "verbs": ["get", "patch"]}
    return [role("controller", [read, status]), role("webhook", [read]), role("gateway", [read, status])]


def describe(ev: dict[str, Any]) -> str:
    ref = ev.get("objectRef") or {}
    res = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    group = ref.get("apiGroup") or "core"
    where = "/".join(x for x in (ref.get("namespace"), ref.get("name")) if x)
    return f"{ev.get('verb')} {group}/{res}" + (f" {where}" if where else "")


# ---------------------------------------------------------------- applying manifests

def _ordered(objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    objects = [copy.deepcopy(o) for o in objects]
    rank = {"CustomResourceDefinition": 0, "Namespace": 1}
    return sorted(objects, key=lambda o: rank.get(o.get("kind", ""), 2))


def _established(http: httpx.Client, name: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = http.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conds = (r.json().get("status") or {}).get("conditions") or [] if r.status_code == 200 else []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
            return
        time.sleep(0.05)
    raise AssertionError(f"CRD {name} not Established in {timeout:.0f}s")


class Resources:
    """Discovery: (group, kind) -> (plural, namespaced), read again when a kind is not found (a CRD
    just made takes a moment to be served)."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self.known: dict[tuple[str, str, str], tuple[str, bool]] = {}

    def lookup(self, api_version: str, kind: str, timeout: float = 30.0) -> tuple[str, bool]:
        group, version = split_api_version(api_version)
        end = time.monotonic() + timeout
        while (group, version, kind) not in self.known:
            path = f"/api/{version}" if not group else f"/apis/{group}/{version}"
            r = self.http.get(path)
            if r.status_code == 200:
                for res in r.json().get("resources", []):
                    if "/" not in res["name"]:
                        self.known[(group, version, res["kind"])] = (res["name"], res["namespaced"])
            if (group, version, kind) in self.known:
                break
            if time.monotonic() > end:
                raise AssertionError(f"{api_version} {kind} is not served")
            time.sleep(0.1)
        return self.known[(group, version, kind)]

    def path(self, obj: dict[str, Any], namespace: str | None = None) -> str:
        plural, namespaced = self.lookup(obj["apiVersion"], obj["kind"])
        group, version = split_api_version(obj["apiVersion"])
        base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
        if namespaced:
            base += f"/namespaces/{namespace or (obj.get('metadata') or {}).get('namespace') or 'default'}"
        return f"{base}/{plural}"


def apply_objects(http: httpx.Client, objects: Iterable[dict[str, Any]], manager: str) -> list[dict[str, Any]]:
    resources = Resources(http)
    out = []
    crds: list[str] = []  # waited for together, before the first object that is not a CRD
    for obj in _ordered(objects):
        if crds and obj["kind"] != "CustomResourceDefinition":
            for name in crds:
                _established(http, name)
            crds = []
        meta = obj.setdefault("metadata", {})
        for k in ("creationTimestamp", "resourceVersion", "uid", "generation", "managedFields"):
            meta.pop(k, None)
        url = f"{resources.path(obj)}/{meta['name']}"
        body = {k: v for k, v in obj.items() if k != "status"}
        r = http.patch(url, params={"fieldManager": manager, "force": "true"}, json=body,
                       headers={"Content-Type": "application/apply-patch+yaml"})
        assert r.status_code < 300, f"apply {obj['kind']} {meta.get('namespace', '')}/{meta['name']}: {r.status_code} {r.text}"
        created = r.json()
        if obj["kind"] == "CustomResourceDefinition":
            crds.append(meta["name"])
        if obj.get("status"):
            st = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": {"name": meta["name"]},
                  "status": obj["status"]}
            r = http.patch(url + "/status", params={"fieldManager": manager, "force": "true"}, json=st,
                           headers={"Content-Type": "application/apply-patch+yaml"})
            if r.status_code < 300:  # a kind without a status subresource keeps none
                created = r.json()
        out.append(created)
    for name in crds:
        _established(http, name)
    return out


def wait_deleted(http: httpx.Client, paths: list[str], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    left = list(paths)
    while left and time.monotonic() < end:
        left = [p for p in left if http.get(p).status_code != 404]
        if left:
            time.sleep(0.1)
    assert not left, f"still there after {timeout:.0f}s: {left}"


def token_of(kubeconfig_path: Path) -> str:
    return yaml.safe_load(kubeconfig_path.read_text())["users"][0]["user"]["token"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def print_timings(write=lambda s: sys.stderr.write(s + "\n")) -> None:
    for what, times in TIMINGS.items():
        write(f"{what}: started {len(times)} time(s), {min(times):.1f}-{max(times):.1f} s "
              f"({sum(times) / len(times):.1f} s on average)")
