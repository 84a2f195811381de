"""`gwpolicy webhook`: serve admission warnings (and optional denials) until SIGTERM/SIGINT."""

from __future__ import annotations

from gwpolicy.controller.app import Options as ControllerOptions
from gwpolicy.engine.status import DEFAULT_CONTROLLER
from gwpolicy.kube import defaults, serve
from gwpolicy.kube.args import HelpFormatter, Parser, program_name
from gwpolicy.kube.endpoints import ListenError
from gwpolicy.webhook.review import Options as ReviewOptions
from gwpolicy.webhook.server import WebhookOptions, WebhookProcess

EXAMPLES = """examples:
  # out of a cluster (or against `gwpolicy sandbox`): one command, it registers itself
  gwpolicy webhook --kubeconfig /tmp/sandbox.kubeconfig
  kubectl apply -f route.yaml      # prints "Warning: HTTPRoute ns/r is affected by ..."

  # refuse policies that would be Conflicted or Invalid
  gwpolicy webhook --deny-conflicts --deny-invalid

  # in a cluster, behind the Service of deploy/60-webhook.yaml, certificate from cert-manager
  gwpolicy webhook --service gwpolicy-system/gwpolicy-webhook \\
      --tls-cert-file /certs/tls.crt --tls-key-file /certs/tls.key --ca-file /certs/ca.crt

  # in a cluster, certificate made by the first replica and shared through a Secret
  gwpolicy webhook --service gwpolicy-system/gwpolicy-webhook \\
      --cert-secret gwpolicy-system/gwpolicy-webhook-tls
"""


def parse(argv: list[str]) -> WebhookOptions:
    p = Parser(
        prog=f"{program_name()} webhook", formatter_class=HelpFormatter, epilog=EXAMPLES,
        description="A validating admission webhook (admission.k8s.io/v1) that warns at apply time when an "
                    "object is affected by policy, or when a policy would be Conflicted, Invalid, without "
                    "target, or beaten; it can deny conflicts and invalid policies instead. It answers from "
                    "a model of the cluster kept by informers.")
    defaults.add_arguments(p, "webhook", listen_flag="--health-listen", leader_election=False)
    p.add_argument("--port", type=int, default=defaults.ADMISSION_PORT,
                   help="HTTPS port of /validate (0 picks one)")
    p.add_argument("--listen-address", default=defaults.host(),
                   help="address to serve /validate on (default: 127.0.0.1, in a pod 0.0.0.0)")
    p.add_argument("--deny-invalid", action="store_true", help="deny a policy that would be Invalid")
    p.add_argument("--deny-conflicts", action="store_true", help="deny a policy that would be Conflicted")
    p.add_argument("--tls-cert-file", help="serving certificate (default: make a CA and a certificate)")
    p.add_argument("--tls-key-file", help="its private key")
    p.add_argument("--ca-file", help="the CA to register as caBundle when the certificate comes from files")
    p.add_argument("--service", metavar="NAMESPACE/NAME",
                   help="register clientConfig.service instead of a url (in a cluster: gwpolicy-system/gwpolicy-webhook)")
    p.add_argument("--cert-secret", metavar="NAMESPACE/NAME",
                   help="keep the made CA and certificate in this Secret, so that every replica serves the same one")
    p.add_argument("--client-ca-file", metavar="FILE",
                   help="answer /validate only for callers presenting a certificate this CA signed: kube-apiserver's "
                        "webhook client authentication (its --admission-control-config-file names the client "
                        "certificate it presents); default: any caller (then a NetworkPolicy should admit only the "
                        "API server, see docs/webhook.md)")
    p.add_argument("--client-name", action="append", default=[], metavar="NAME",
                   help="with --client-ca-file: the client certificate's common name or a DNS name must be one of "
                        "these (repeatable)")
    p.add_argument("--url", help="register this clientConfig.url (default: https://ADDRESS:PORT/validate)")
    p.add_argument("--no-register", action="store_true", help="do not create or update the ValidatingWebhookConfiguration")
    p.add_argument("--failure-policy", choices=["Ignore", "Fail"], default="Ignore",
                   help="failurePolicy to register (an apply goes through when the webhook is down)")
    p.add_argument("--timeout-seconds", type=int, default=5, help="timeoutSeconds to register")
    a = p.parse_args(argv)
    if bool(a.tls_cert_file) != bool(a.tls_key_file):
        p.error("--tls-cert-file and --tls-key-file go together")
    if a.client_name and not a.client_ca_file:
        p.error("--client-name needs --client-ca-file")
    if not 0 <= a.port <= 65535:
        p.error(f"--port {a.port}: not a port number")
    serve.setup_logging(a.verbose)
    copts = ControllerOptions(**defaults.options(a), controller_name=DEFAULT_CONTROLLER, field_manager="gwpolicy-webhook")
    return WebhookOptions(copts, ReviewOptions(deny_invalid=a.deny_invalid, deny_conflicts=a.deny_conflicts),
                          host=a.listen_address, port=a.port, cert_file=a.tls_cert_file, key_file=a.tls_key_file,
                          ca_file=a.ca_file, url=a.url, service=a.service, cert_secret=a.cert_secret, register=not a.no_register,
                          failure_policy=a.failure_policy, timeout_seconds=a.timeout_seconds,
                          client_ca_file=a.client_ca_file, client_names=tuple(a.client_name))


def main(argv: list[str]) -> int:
    opts = parse(argv)
    w = WebhookProcess(opts)
    # OSError: a busy port, an unreadable certificate; ListenError: --health-listen busy or malformed
    return serve.run(w, lambda: f"gwpolicy webhook serving https://{opts.host}:{w.webhook_port}/validate",
                     (OSError, ListenError))
