"""`HOST:PORT` listen addresses: parsed once here for `[server]` and the listeners."""

from __future__ import annotations


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def url_host(host: str) -> str:
    """`host` as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host
