"""The data plane model (what NGINX must do) and how it is built: the middle of the gateway's pipeline
facts -> data plane model -> render -> NGINX process.

model.py: the plain data and its names; build.py: the builder (from the engine's analysis and the
facts), with backends.py (backendRefs and mirrors -> upstreams), addresses.py (hostnames and
Gateway addresses) and order.py (locations and the precedence of their match rules);
cache.py: what in-place updates reuse. This package re-exports what other layers use."""

from gwpolicy.gateway.dataplane.addresses import gateway_addresses, intersect_hostname, route_hostnames
from gwpolicy.gateway.dataplane.build import build_dataplane, route_cost
from gwpolicy.gateway.dataplane.cache import BuildCache, memo, programmable, signature, without_gc
from gwpolicy.gateway.dataplane.model import (
                                              BACKEND_NOT_FOUND,
                                              BACKEND_TLS_INVALID,
                                              BUDGET_EXCEEDED,
                                              DEFAULT_ADDRESS_POOL,
                                              DEFAULT_CONTROLLER_NAME,
                                              ENDPOINTSLICE_CONTROLLER,
                                              INVALID_KIND,
                                              MANAGED_BY_LABEL,
                                              NO_ENDPOINTS,
                                              PATH_RANK,
                                              POLICY_GROUP,
                                              PORT_UNAVAILABLE,
                                              REF_NOT_PERMITTED,
                                              REGULAR_EXPRESSION,
                                              SERVICE_NAME_LABEL,
                                              SOCKET_DIR,
                                              STREAM_MODULE,
                                              UNSUPPORTED_PROTOCOL,
                                              UNSUPPORTED_VALUE,
                                              Action,
                                              Backend,
                                              DataPlane,
                                              DataPlaneConfig,
                                              DataPlaneError,
                                              Endpoint,
                                              ListenerFact,
                                              Location,
                                              MatchRule,
                                              Mirror,
                                              PassthroughBackend,
                                              PassthroughRoute,
                                              PassthroughServer,
                                              RouteFact,
                                              Server,
                                              Upstream,
                                              VirtualHost,
                                              action_id,
                                              address_key,
                                              as_dict,
                                              as_list,
                                              client_ca_path,
                                              endpoint_problem,
                                              server_id,
                                              slug,
                                              stream_module_path,
                                              tls_upstream_name,
                                              upstream_base,
)

__all__ = [
    "BACKEND_NOT_FOUND", "BACKEND_TLS_INVALID", "BUDGET_EXCEEDED", "DEFAULT_ADDRESS_POOL", "DEFAULT_CONTROLLER_NAME",
    "ENDPOINTSLICE_CONTROLLER", "INVALID_KIND", "MANAGED_BY_LABEL", "NO_ENDPOINTS", "PATH_RANK", "POLICY_GROUP",
    "PORT_UNAVAILABLE", "REF_NOT_PERMITTED", "REGULAR_EXPRESSION", "SERVICE_NAME_LABEL", "SOCKET_DIR",
    "STREAM_MODULE", "UNSUPPORTED_PROTOCOL", "UNSUPPORTED_VALUE", "Action", "action_id", "address_key", "as_dict",
    "as_list", "Backend", "client_ca_path", "DataPlane", "DataPlaneConfig", "DataPlaneError", "Endpoint",
    "endpoint_problem", "ListenerFact", "Location", "MatchRule", "Mirror", "PassthroughBackend", "PassthroughRoute",
    "PassthroughServer", "RouteFact", "Server", "server_id", "slug", "stream_module_path", "tls_upstream_name",
    "Upstream", "upstream_base", "VirtualHost", "gateway_addresses", "intersect_hostname", "route_hostnames",
    "BuildCache", "memo", "programmable", "signature", "without_gc", "build_dataplane", "route_cost",
]
