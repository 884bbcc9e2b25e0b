"""``intentlog gateway``: a journaling egress gateway for agents in any language.

An agent calls the gateway instead of the API (``POST http://gateway/stripe/v1/charges``
instead of ``POST https://api.stripe.com/v1/charges``). Every POST, PUT, PATCH and DELETE on a
journaled route gets its intent journaled before it is forwarded, with the operation key where
the route's service takes it (:mod:`intentlog.profiles`), and its answer recorded; a repeat,
after a crash on either side, is answered from the journal, reconciled with the service, or
refused as UNRESOLVED (409), never sent blindly a second time. See docs/gateway.md.
"""

from intentlog.gateway._routes import Route, RouteFile, load_routes, parse_routes
from intentlog.gateway._serve import GatewayConfig, serve

__all__ = ["GatewayConfig", "Route", "RouteFile", "load_routes", "parse_routes", "serve"]
