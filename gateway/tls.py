"""HTTPS served by the gateway itself: the TLS context of `[server] tls_cert` and `tls_key`.

Terminating TLS in a reverse proxy in front of the gateway works as well (docs/security.md); this is
for a gateway that faces clients directly.
"""

from __future__ import annotations

import ssl

from gateway.config import ConfigError, ServerConfig


def tls_context(server: ServerConfig) -> ssl.SSLContext | None:
    """The server-side TLS context (TLS 1.2 at least), or None when the gateway serves plain HTTP."""
    if not server.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(server.tls_cert, server.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"server.tls_cert/tls_key: cannot load {server.tls_cert} and {server.tls_key}: {exc}"
        ) from None
    return context
