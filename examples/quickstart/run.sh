#!/usr/bin/env bash
# The gateway quickstart: a sandbox API server, `gwpolicy gateway` (NGINX as its data plane), two
# echo backends; a Gateway and an HTTPRoute applied with kubectl; curl through NGINX.
# Needs gwpolicy (./dev sets up .venv), kubectl, nginx 1.22+ with njs, curl. Everything it starts
# is stopped when it exits. Ports below 1024 need root; as another user set PORT_OFFSET=8000 (the
# Gateway's port 80 is then served on 8080). ADDRESS_POOL picks the loopback network Gateways get
# their addresses from.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PATH="$root/.venv/bin:$PATH"
offset=${PORT_OFFSET:-0}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
export KUBECONFIG="$work/kubeconfig"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# the sandbox starts with the Gateway API CRDs (deploy/gateway-api/standard) and gwpolicy's own
gwpolicy sandbox --port 0 --allow-loopback-endpoints --kubeconfig-out "$KUBECONFIG" >"$work/sandbox.log" 2>&1 & pids+=($!)
for _ in $(seq 50); do [ -s "$KUBECONFIG" ] && break; sleep 0.1; done

v1=$(free_port); v2=$(free_port)
gwpolicy echo --port "$v1" --pod shop-v1-7d4b9c-x1 --namespace quickstart >"$work/v1.log" 2>&1 & pids+=($!)
gwpolicy echo --port "$v2" --pod shop-v2-5f6a8e-y2 --namespace quickstart >"$work/v2.log" 2>&1 & pids+=($!)

# the echo backends run on this machine and backends.yaml.in publishes them with EndpointSlices of
# its own (no EndpointSlice controller here): both need the gateway's opt-ins, which a gateway in a
# cluster leaves off (docs/security.md, "Endpoints")
gwpolicy gateway --kubeconfig "$KUBECONFIG" --no-leader-election --listen 127.0.0.1:0 \
  --allow-unmanaged-endpointslices --allow-loopback-endpoints \
  --state-dir "$work/nginx" --port-offset "$offset" ${ADDRESS_POOL:+--address-pool "$ADDRESS_POOL"} >"$work/gateway.log" 2>&1 & pids+=($!)

kubectl apply --server-side -f "$here/gateway.yaml"
sed -e "s/@V1_PORT@/$v1/g" -e "s/@V2_PORT@/$v2/g" "$here/backends.yaml.in" | kubectl apply --server-side -f -
kubectl wait --for=condition=Programmed gateway/demo -n quickstart --timeout=60s
address=$(kubectl get gateway demo -n quickstart -o jsonpath='{.status.addresses[0].value}')
port=$((80 + offset))
echo "Gateway demo is served on $address:$port"
kubectl get httproute shop -n quickstart -o jsonpath='{range .status.parents[*]}{.parentRef.name}: {range .conditions[*]}{.type}={.status} {end}{"\n"}{end}'
for path in / /v2/cart; do
  echo "--- curl -H 'Host: shop.example' http://$address:$port$path"
  curl -sS --max-time 5 -H 'Host: shop.example' "http://$address:$port$path"; echo
done
echo "--- a host no route serves:"
curl -sS --max-time 5 -o /dev/null -w '%{http_code}\n' -H 'Host: other.example' "http://$address:$port/"
