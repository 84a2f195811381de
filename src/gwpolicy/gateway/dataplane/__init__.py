"""The data plane model: what NGINX must do, built from the engine's analysis and the facts."""

from gwpolicy.gateway.dataplane.build import *  # noqa: F401,F403
