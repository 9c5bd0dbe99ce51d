"""A caller on one upstream's own endpoint (`on_route`): its owner carries the route, and the route is
read back from the owner (`route_of`), which is how a restarted gateway picks a task's watcher."""

from __future__ import annotations

from gateway.principal import ANONYMOUS_PRINCIPAL, Principal, on_route, route_of


def test_the_main_endpoint_keeps_the_principal_as_it_is() -> None:
    principal = Principal("p_0123", frozenset({"build"}), {"team": "x"})
    assert on_route(principal, None) is principal
    assert route_of(principal.owner) is None and route_of(ANONYMOUS_PRINCIPAL.owner) is None


def test_an_upstreams_endpoint_binds_the_owner_to_its_route_and_nothing_else() -> None:
    principal = Principal("p_0123", frozenset({"build"}), {"team": "x"})
    scoped = on_route(principal, "build-2")
    assert scoped.owner == "p_0123@build-2" and route_of(scoped.owner) == "build-2"
    assert scoped.scopes == principal.scopes and scoped.claims == principal.claims
    assert on_route(principal, "time").owner != scoped.owner  # one caller, two routes: two owners
    assert route_of(on_route(ANONYMOUS_PRINCIPAL, "time").owner) == "time"
