"""The gateway: an NGINX data plane driven by the engine's analysis."""
