"""`gwpolicy webhook`: AdmissionReview (admission.k8s.io/v1) over HTTPS, answered from the controller's
model of the cluster (informers, never a list per request).

Out of a cluster it makes its own CA and serving certificate and creates or updates the
ValidatingWebhookConfiguration `gwpolicy` pointing at `https://127.0.0.1:PORT/validate` with that CA
as `caBundle`; in a cluster it serves the certificate it is given (or makes one) behind the Service of
`deploy/60-webhook.yaml` and patches that configuration's `caBundle`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson
from aiohttp import web
from lightkube import ApiError

from gwpolicy.controller.app import Controller
from gwpolicy.controller.app import Options as ControllerOptions
from gwpolicy.controller.model import ClusterModel
from gwpolicy.engine.refs import GATEWAY_GROUP
from gwpolicy.kube import certs, defaults
from gwpolicy.kube import client as kube
from gwpolicy.kube.client import Kind
from gwpolicy.kube.loop import synced_bursts
from gwpolicy.webhook.review import Options as ReviewOptions
from gwpolicy.webhook.review import review

log = logging.getLogger("gwpolicy.webhook")

CONFIG_NAME = "gwpolicy"
WEBHOOK_NAME = "validate.gwpolicy.io"
VWC = Kind("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration",
           "validatingwebhookconfigurations", False, False)


@dataclass
class WebhookOptions:
    controller: ControllerOptions
    review: ReviewOptions = field(default_factory=ReviewOptions)
    host: str = "127.0.0.1"
    port: int = defaults.ADMISSION_PORT
    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None  # the CA to put in caBundle when the certificate comes from files
    url: str | None = None  # clientConfig.url; default https://HOST:PORT/validate
    service: str | None = None  # NAMESPACE/NAME: clientConfig.service instead of a url (in a cluster)
    cert_secret: str | None = None  # NAMESPACE/NAME: a Secret that holds the made CA and certificate, shared by replicas
    register: bool = True
    failure_policy: str = "Ignore"
    timeout_seconds: int = 5
    #: kube-apiserver's webhook client authentication: /validate answers only callers that present a
    #: certificate this CA signed (and, when given, whose common name or a DNS name is one of these)
    client_ca_file: str | None = None
    client_names: tuple[str, ...] = ()


class Reviewer:
    """Answers AdmissionReviews from a ClusterModel; a review that leaves the analysis half-changed
    marks it stale, and `wake` gets the model analysed again."""

    def __init__(self, model: ClusterModel, opts: ReviewOptions, wake: Callable[[], None],
                 client_ca: bool = False, client_names: tuple[str, ...] = ()) -> None:
        self.model = model
        self.opts = opts
        self.wake = wake
        self.client_ca = client_ca  # the TLS layer verified a presented certificate; one must be presented
        self.client_names = frozenset(client_names)
        self.latencies: list[float] = []  # seconds per review, the newest 10,000

    def answer(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("request"), dict):
            raise web.HTTPBadRequest(text="want an AdmissionReview with a request")
        req = body["request"]
        t = time.perf_counter()
        model = self.model
        analysis = None if model.stale else model.analysis
        try:
            verdict, broken = review(analysis, req, self.opts, lambda: model.objects.values())
        except Exception:  # noqa: BLE001 - a review must answer; the API server's failurePolicy is for outages
            log.exception("review of %s failed", req.get("uid"))
            from gwpolicy.webhook.review import Verdict
            verdict, broken = Verdict(), True
        if broken:
            model.stale = True
            self.wake()
        self.latencies.append(time.perf_counter() - t)
        if len(self.latencies) > 10_000:
            del self.latencies[:5_000]
        return {"apiVersion": body.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview",
                "response": verdict.response(str(req.get("uid", "")))}

    def authorize(self, request: web.Request) -> None:
        """With a client CA, only a caller with a certificate it signed (and, with client names, one
        of those names) is answered: a review tells about other namespaces' policies and values."""
        if not self.client_ca:
            return
        peer = request.transport.get_extra_info("peercert") if request.transport is not None else None
        if not peer:
            raise web.HTTPUnauthorized(text="a client certificate signed by the webhook's client CA is required")
        if self.client_names and not (peer_names(peer) & self.client_names):
            raise web.HTTPForbidden(text="the client certificate's name is not one this webhook answers")

    async def handle(self, request: web.Request) -> web.Response:
        self.authorize(request)
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            raise web.HTTPBadRequest(text="the body is not JSON") from None
        return web.Response(body=orjson.dumps(self.answer(body)), content_type="application/json")


def server_ssl(cert_file: str, key_file: str, client_ca_file: str | None = None) -> ssl.SSLContext:
    """The webhook's TLS; with `client_ca_file`, a client certificate is asked for and must verify
    against it (a caller that presents none still gets TLS: /healthz answers it, /validate does not)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        ctx.load_verify_locations(client_ca_file)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def peer_names(peer: dict[str, Any]) -> set[str]:
    """A verified client certificate's common names and DNS subject alternative names."""
    names = {v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"}
    return names | {v for k, v in peer.get("subjectAltName", ()) if k == "DNS"}


async def _healthz(_request: web.Request) -> web.Response:
    """The probe's answer; a coroutine, as aiohttp wants a handler (a plain function is deprecated)."""
    return web.Response(text="ok")


def webhook_configuration(ca_pem: bytes, groups: list[str], opts: WebhookOptions, port: int) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration: Gateway API objects, Services, Namespaces and policy kinds;
    never subresources (status writes do not pass through it)."""
    client: dict[str, Any] = {"caBundle": base64.b64encode(ca_pem).decode()}
    if opts.service:
        ns, _, name = opts.service.partition("/")
        client["service"] = {"namespace": ns, "name": name, "path": "/validate", "port": 443}
    else:
        client["url"] = opts.url or f"https://{opts.host}:{port}/validate"
    ops = ["CREATE", "UPDATE", "DELETE"]
    rules = [{"operations": ops, "apiGroups": [GATEWAY_GROUP], "apiVersions": ["*"], "resources": ["*"], "scope": "*"},
             {"operations": ops, "apiGroups": [""], "apiVersions": ["v1"], "resources": ["services", "namespaces"],
              "scope": "*"}]
    others = sorted({g for g in groups if g not in (GATEWAY_GROUP, "")})
    if others:
        rules.append({"operations": ops, "apiGroups": others, "apiVersions": ["*"], "resources": ["*"], "scope": "*"})
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": CONFIG_NAME, "labels": {"app.kubernetes.io/name": "gwpolicy"}},
            "webhooks": [{"name": WEBHOOK_NAME, "clientConfig": client, "rules": rules,
                          "failurePolicy": opts.failure_policy, "sideEffects": "None",
                          "timeoutSeconds": opts.timeout_seconds, "admissionReviewVersions": ["v1"],
                          "matchPolicy": "Equivalent"}]}


class WebhookProcess(Controller):
    """The controller's informers and model without its writers: the webhook's view of the cluster."""

    command = "webhook"
    listen_flag = "--health-listen"

    def __init__(self, opts: WebhookOptions) -> None:
        super().__init__(opts.controller)
        self.wopts = opts
        self.reviewer = Reviewer(self.model, opts.review, self.wake.set, bool(opts.client_ca_file), opts.client_names)
        self.webhook_runner: web.AppRunner | None = None
        self.webhook_port: int | None = None
        self.ca_pem = b""
        self.registered_groups: list[str] | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    async def _certificate(self) -> tuple[str, str]:
        o = self.wopts
        if o.cert_file and o.key_file:
            with open(o.ca_file or o.cert_file, "rb") as f:
                self.ca_pem = f.read()
            return o.cert_file, o.key_file
        ca, serving = await self._made_certificate()
        self._tmp = tempfile.TemporaryDirectory(prefix="gwpolicy-webhook-")
        self.ca_pem = ca.cert_pem
        return certs.write_pair(self._tmp.name, "tls", serving)

    async def _made_certificate(self) -> tuple[certs.KeyPair, certs.KeyPair]:
        """A CA and a serving certificate; with --cert-secret, the ones the first replica stored there
        (every replica serves the certificate the registered caBundle vouches for)."""
        o = self.wopts
        secret = None
        if o.cert_secret and self.client is not None:
            ns, _, name = o.cert_secret.partition("/")
            secret = Kind("", "v1", "Secret", "secrets", True, False)
            for _ in range(3):
                try:
                    data = (await kube.get_object(self.client, secret, name, ns)).get("data") or {}
                    return (certs.KeyPair(base64.b64decode(data["ca.crt"]), base64.b64decode(data["ca.key"])),
                            certs.KeyPair(base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"])))
                except ApiError as exc:
                    if exc.status.code != 404:
                        raise
                except KeyError:
                    log.warning("Secret %s lacks ca.crt/ca.key/tls.crt/tls.key: making a new certificate", o.cert_secret)
                ca, serving = self._new_certificate()
                body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns},
                        "type": "Opaque", "data": {k: base64.b64encode(v).decode() for k, v in
                                                   (("ca.crt", ca.cert_pem), ("ca.key", ca.key_pem),
                                                    ("tls.crt", serving.cert_pem), ("tls.key", serving.key_pem))}}
                try:  # a create, not an apply: of two replicas starting together, one makes it
                    # (lightkube's overload for a namespaced resource omits the `namespace` its create takes)
                    await self.client.create(kube.resource_class(secret).from_dict(body), namespace=ns)  # type: ignore[call-overload]
                    return ca, serving
                except ApiError as exc:  # another replica stored one first: read it
                    if exc.status.code != 409:
                        raise
        return self._new_certificate()

    def _new_certificate(self) -> tuple[certs.KeyPair, certs.KeyPair]:
        o = self.wopts
        ca = certs.make_ca()
        hosts = [o.host] if o.host not in ("0.0.0.0", "::") else ["127.0.0.1"]
        if o.service:
            ns, _, name = o.service.partition("/")
            hosts += [f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"]
        hosts.append("localhost")
        return ca, certs.make_serving(ca, hosts)

    async def serve(self) -> None:
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_post("/validate", self.reviewer.handle)
        app.router.add_get("/healthz", _healthz)
        self.webhook_runner = web.AppRunner(app, access_log=None)
        await self.webhook_runner.setup()
        site = web.TCPSite(self.webhook_runner, self.wopts.host, self.wopts.port, ssl_context=server_ssl(*await self._certificate(),
                                                                                                            self.wopts.client_ca_file))
        await site.start()
        self.webhook_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def policy_groups(self) -> list[str]:
        a = self.model.analysis
        groups = {"gwpolicy.io"} | ({g for g, _ in a.kinds} if a is not None else set())
        return sorted(groups)

    async def register(self) -> None:
        """Create or update the configuration (server-side apply); again when new policy groups appear."""
        groups = self.policy_groups()
        if groups == self.registered_groups or self.client is None or self.webhook_port is None:
            return
        body = webhook_configuration(self.ca_pem, groups, self.wopts, self.webhook_port)
        await self.client.patch(kube.resource_class(VWC), CONFIG_NAME, body, patch_type=kube.PatchType.APPLY,
                                field_manager="gwpolicy-webhook", force=True)
        self.registered_groups = groups
        log.info("ValidatingWebhookConfiguration %s points at %s", CONFIG_NAME,
                 body["webhooks"][0]["clientConfig"].get("url") or self.wopts.service)

    async def register_loop(self) -> None:
        """Register once the model holds a first analysis (its policy groups are then known; until then
        the webhook would answer without warnings anyway); then follow new policy groups."""
        for _ in range(300):
            if self.model.analysis is not None:
                break
            await asyncio.sleep(0.1)
        while True:
            try:
                await self.register()
            except ApiError as exc:
                log.warning("cannot register the webhook configuration: %s", exc.status.message)
            except Exception:  # noqa: BLE001 - keep serving; try again
                log.exception("registering the webhook configuration failed")
            await asyncio.sleep(2.0)

    async def started(self) -> None:
        """The HTTPS server, the model kept analysed and the registration; no status writers."""
        await self.serve()
        self.tasks.append(asyncio.create_task(self.reconcile_loop(), name="reconcile"))
        if self.wopts.register:
            self.tasks.append(asyncio.create_task(self.register_loop(), name="register"))

    async def reconcile_loop(self) -> None:
        """The model kept analysed; nothing is queued for writing."""
        async for _ in synced_bursts(self, self.opts.debounce, self.listed):
            t = time.perf_counter()
            try:
                self.model.reconcile()
                self.model.touched = set()
            except Exception:  # noqa: BLE001 - the webhook must keep answering
                log.exception("analysis failed")
                self.metrics.errors.labels("reconcile").inc()
                continue
            self.count_pass(t)

    async def stopping(self) -> None:
        """/validate stops answering first."""
        if self.webhook_runner:
            await self.webhook_runner.cleanup()
        await super().stopping()

    async def stopped(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
