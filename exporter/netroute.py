"""Which network interface routes to an address: one netlink RTM_GETROUTE (pyroute2)."""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


def route_device(address: str) -> str | None:
    """The interface the kernel would use to reach `address`, or None (no route, not an IP)."""
    try:
        ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None  # a host name: resolving it would put DNS on the scrape path
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        with IPRoute() as ipr:
            routes = ipr.route("get", dst=address.split("%", 1)[0])
            if not routes:
                return None
            oif = routes[0].get_attr("RTA_OIF")
            if oif is None:
                return None
            links = ipr.get_links(oif)
            return links[0].get_attr("IFLA_IFNAME") if links else None
    except (NetlinkError, OSError) as err:
        log.debug("no route to %s: %s", address, err)
        return None


class CachedLookup:
    """Routes change rarely; look each address up at most once per `ttl` seconds."""

    def __init__(self, lookup: Callable[[str], str | None], ttl: float = 60.0) -> None:
        self._lookup = lookup
        self._ttl = ttl
        self._cache: dict[str, tuple[float, str | None]] = {}

    def __call__(self, address: str) -> str | None:
        now = time.monotonic()
        hit = self._cache.get(address)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        device = self._lookup(address)
        self._cache[address] = (now, device)
        return device
