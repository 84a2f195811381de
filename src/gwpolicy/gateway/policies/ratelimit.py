"""RateLimitPolicy: `limit_req` in a location and the `limit_req_zone` it needs in the http context."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from gwpolicy.gateway.policies.generator import LocationWork, RateZone, UpstreamWork
from gwpolicy.gateway.policies.values import DEFAULT_ZONE_SIZE, RATELIMIT, PolicyValueError, bounded, is_set, zone_size


def rate_zone(spec: Mapping[str, Any], scope: str = "") -> RateZone:
    """The zone a RateLimitPolicy effective spec needs; named by a hash of settings and scope."""
    requests = bounded(RATELIMIT, "requests", spec.get("requests"))
    unit = spec.get("unit", "Second")
    if unit not in ("Second", "Minute"):
        raise PolicyValueError(f"{RATELIMIT} unit: {unit!r} must be Second or Minute")
    rate = f"{requests}r/{'s' if unit == 'Second' else 'm'}"
    key_spec = spec.get("key") or {}
    ktype = key_spec.get("type", "ClientAddress") if isinstance(key_spec, Mapping) else "ClientAddress"
    if ktype == "ClientAddress":
        key = "$binary_remote_addr"
    elif ktype == "Header":
        header = key_spec.get("header")
        if not isinstance(header, str) or not re.fullmatch(r"[A-Za-z0-9-]+", header):
            raise PolicyValueError(f"{RATELIMIT} key.header: {header!r} must be a header name (letters, digits, -)")
        key = "$http_" + header.lower().replace("-", "_")
    else:
        raise PolicyValueError(f"{RATELIMIT} key.type: {ktype!r} must be ClientAddress or Header")
    size = zone_size(bounded(RATELIMIT, "zoneSize", spec.get("zoneSize", DEFAULT_ZONE_SIZE)))
    digest = hashlib.sha256(f"{scope}|{key}|{rate}|{size}".encode()).hexdigest()[:12]
    return RateZone(f"rl_{digest}", key, size, rate)


class RateLimit:
    kind = RATELIMIT

    def location(self, rl: Mapping[str, Any], work: LocationWork) -> None:
        if not is_set(rl, "requests"):
            return
        # one bucket per policy that sets the rate: two routes with equal but separate policies
        # do not share one (the caller may pass its own scope; Effective knows the supplying policy)
        zone = rate_zone(rl, work.scope or getattr(rl, "origin", {}).get("requests", ""))
        work.zones.append(zone)
        burst = bounded(RATELIMIT, "burst", rl.get("burst", 0))
        parts = [f"zone={zone.name}"] + ([f"burst={burst}"] if burst else [])
        if rl.get("noDelay", True) is not False:
            parts.append("nodelay")
        work.lines.append(f"limit_req {' '.join(parts)};")
        work.lines.append("limit_req_status 429;")

    def upstream(self, rl: Mapping[str, Any], work: UpstreamWork) -> None:
        pass  # per location only


GENERATOR = RateLimit()
