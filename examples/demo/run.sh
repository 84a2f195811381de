#!/usr/bin/env bash
# The demo (./dev demo): a policy changing traffic, on this machine alone. It starts the sandbox (a
# local Kubernetes API server with the Gateway API and gwpolicy CRDs), two echo backends (reports is
# slow on /reports/monthly) and `gwpolicy gateway` (NGINX); applies a Gateway, an HTTPRoute and
# GEP-713's TimeoutPolicy example (an override on the Gateway, a default on the Service); shows curl
# getting 504 on the slow path and 200 on the fast one, `gwpolicy describe` saying which policy set
# each value and what it beat, and, once the Service's policy is deleted, the 504 turned into 200.
#
#   examples/demo/run.sh          run it and stop everything it started
#   examples/demo/run.sh --keep   leave the playground up until Ctrl-C, to try more with kubectl
#
# The Gateway listens on port 8080 (no root needed) of the first address of DEMO_ADDRESS_POOL
# (default 127.0.1.0/24, so 127.0.1.1:8080); DEMO_PORT picks another port (a free one is taken when
# 8080 is busy). Needs gwpolicy (./dev sets up .venv), kubectl, nginx 1.22+, curl.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PATH="$root/.venv/bin:$PATH"
keep=
for arg in "$@"; do
  case $arg in
    --keep) keep=1 ;;
    *) echo "usage: $0 [--keep]" >&2; exit 2 ;;
  esac
done
for tool in gwpolicy kubectl curl nginx; do
  command -v "$tool" >/dev/null || [ "$tool" = nginx -a -x /usr/sbin/nginx ] \
    || { echo "error: $tool is missing (./dev demo installs gwpolicy; see README.md for the rest)" >&2; exit 1; }
done
pool=${DEMO_ADDRESS_POOL:-127.0.1.0/24}
started=$(date +%s.%N)
work=$(mktemp -d "${TMPDIR:-/tmp}/gwpolicy-demo.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
export KUBECONFIG="$work/kubeconfig" KUBECACHEDIR="$work/kube-cache"
shown=${here#"$PWD"/}  # examples/demo, as the user would type it from the checkout

if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold= plain=; fi
step() { printf '\n%s==> %s%s\n' "$bold" "$*" "$plain"; }
show() { printf '$ %s\n' "$*"; "$@"; }
# wait_for SECONDS WHAT COMMAND...: run COMMAND until it succeeds
wait_for() {
  local seconds=$1 what=$2; shift 2
  local end=$(( $(date +%s) + seconds ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$end" ]; then
      echo "error: $what did not happen within ${seconds}s; logs:" >&2
      tail -n 20 "$work"/*.log >&2 || true
      exit 1
    fi
    sleep 0.1
  done
}
# started_line FILE PATTERN: wait for a process's start line in its log, print what PATTERN captures
started_line() {
  wait_for 60 "the start of ${1##*/}" grep -qE "$2" "$1"
  sed -nE "s#.*$2.*#\\1#p" "$1" | head -n 1
}
free_port() {  # free_port ADDRESS [PREFERRED]
  python - "$@" <<'EOF'
import socket, sys
address, preferred = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
for port in (preferred, 0):
    try:
        with socket.socket() as s:
            s.bind((address, port))
            print(s.getsockname()[1])
            break
    except OSError:
        continue
EOF
}
curl_show() {  # curl_show PATH: one request through the Gateway, its status, time and answering pod
  local path=$1 out code secs pod
  printf '$ curl -H "Host: shop.example" http://%s:%s%s\n' "$address" "$port" "$path"
  out=$(curl -sS --max-time 10 -H 'Host: shop.example' -w '\n%{http_code} %{time_total}' "http://$address:$port$path")
  read -r code secs <<<"$(tail -n 1 <<<"$out")"
  pod=$(sed -nE 's/.*"pod": "([^"]*)".*/\1/p' <<<"$out" | head -n 1)
  printf '  HTTP %s after %.1f s%s\n' "$code" "$secs" "${pod:+, answered by $pod}"
}
reloads() {  # NGINX reloads the gateway has made so far
  curl -s "http://127.0.0.1:$health/metrics" | sed -nE 's/^gwpolicy_gateway_nginx_reloads_total\{result="ok"\} ([0-9.]+).*/\1/p'
}

step "Starting the sandbox: a local Kubernetes API server, with the Gateway API and gwpolicy CRDs installed"
# the echo backends listen on loopback: their EndpointSlices name 127.0.0.1, which a cluster (and the
# sandbox without this flag) refuses
gwpolicy sandbox --port 0 --allow-loopback-endpoints --kubeconfig-out "$KUBECONFIG" >"$work/sandbox.log" 2>&1 & pids+=($!)
echo "  $(started_line "$work/sandbox.log" '(gwpolicy sandbox listening on [^;]*)')"

step "Starting two echo backends: shop, and reports (which takes 2 s to answer /reports/monthly)"
gwpolicy echo --port 0 --pod shop-7d4b9c-x1 --namespace demo >"$work/shop.log" 2>&1 & pids+=($!)
gwpolicy echo --port 0 --pod reports-5f6a8e-y2 --namespace demo --delay /reports/monthly=2s >"$work/reports.log" 2>&1 & pids+=($!)
shop_port=$(started_line "$work/shop.log" 'on http://127\.0\.0\.1:([0-9]+)')
reports_port=$(started_line "$work/reports.log" 'on http://127\.0\.0\.1:([0-9]+)')
echo "  shop on 127.0.0.1:$shop_port, reports on 127.0.0.1:$reports_port"

step "Starting the gateway: gwpolicy gateway, with NGINX as its data plane"
# the backends run on this machine and their EndpointSlices are the demo's own: the gateway's two
# opt-ins for that (in a cluster it uses only the EndpointSlice controller's, never loopback)
gwpolicy gateway --kubeconfig "$KUBECONFIG" --listen 127.0.0.1:0 --state-dir "$work/nginx" --address-pool "$pool" \
  --allow-unmanaged-endpointslices --allow-loopback-endpoints >"$work/gateway.log" 2>&1 & pids+=($!)
health=$(started_line "$work/gateway.log" 'serving health and metrics on port ([0-9]+)')
echo "  its health and metrics on 127.0.0.1:$health"

address=$(python -c 'import ipaddress, sys; print(next(ipaddress.ip_network(sys.argv[1], strict=False).hosts()))' "$pool")
port=${DEMO_PORT:-$(free_port "$address" 8080)}
step "Applying a GatewayClass, a Gateway (port $port) and an HTTPRoute, and the two backends"
sed "s/@PORT@/$port/" "$here/gateway.yaml.in" >"$work/gateway.yaml"
sed -e "s/@SHOP_PORT@/$shop_port/" -e "s/@REPORTS_PORT@/$reports_port/" "$here/backends.yaml.in" >"$work/backends.yaml"
printf '$ kubectl apply -f gateway.yaml -f backends.yaml   # %s/*.yaml.in with the ports filled in\n' "$shown"
kubectl apply -f "$work/gateway.yaml" -f "$work/backends.yaml"
show kubectl wait --for=condition=Programmed gateway/demo -n demo --timeout=60s || {
  echo "error: the Gateway is not programmed: $(kubectl get gateway demo -n demo -o \
    jsonpath='{.status.conditions[?(@.type=="Programmed")].message}')" >&2
  exit 1
}
address=$(kubectl get gateway demo -n demo -o jsonpath='{.status.addresses[0].value}')

step "Applying the TimeoutPolicies: an override on the Gateway, defaults on the reports Service"
sed -n '/^apiVersion/,$p' "$here/timeouts.yaml" | sed 's/^/  /'
show kubectl apply -f "$shown/timeouts.yaml"
accepted() {
  [ "$(kubectl get timeoutpolicy "$1" -n demo -o \
    jsonpath='{.status.ancestors[?(@.controllerName=="gwpolicy.io/gateway-controller")].conditions[?(@.type=="Accepted")].status}')" = True ]
}
wait_for 60 "the gateway's acceptance of the policies" eval 'accepted gateway-timeouts && accepted reports-timeouts'
echo "  both Accepted by the gateway, and in NGINX's configuration"

step "Traffic: the reports Service's readTimeout of 1s cuts the slow path; the fast one answers"
curl_show /reports/monthly
curl_show /reports/daily

step "Which policy set each value, and what it beat"
show gwpolicy describe service/reports -n demo

step "What deleting the Service's policy would change"
show gwpolicy impact timeoutpolicy/reports-timeouts -n demo

step "Deleting it: the slow path is no longer cut"
before=$(reloads)
show kubectl delete timeoutpolicy reports-timeouts -n demo
wait_for 30 "the gateway's reload of NGINX" eval '[ "$(reloads)" != "$before" ]'
curl_show /reports/monthly

elapsed=$(python -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$started" "$(date +%s.%N)")
if [ -z "$keep" ]; then
  step "Done in ${elapsed} s; everything the demo started is stopped now"
  echo "  ./dev demo --keep leaves the playground up to try more; ./dev demo parable describes GEP-713's parable"
  exit 0
fi
step "Done in ${elapsed} s. The playground is up until Ctrl-C; in another shell:"
cat <<EOF
  export KUBECONFIG=$KUBECONFIG PATH=$root/.venv/bin:\$PATH
  kubectl get gateways,httproutes,timeoutpolicies -A
  curl -H 'Host: shop.example' http://$address:$port/reports/monthly
  kubectl apply -f $here/timeouts.yaml   # the Service's policy back: 504 again
  gwpolicy describe httproute/shop -n demo
EOF
sleep infinity & pids+=($!)
wait $!
