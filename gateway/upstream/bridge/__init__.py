"""Era bridging: a client of one protocol era served by an upstream that speaks only the other.

The seam is `BridgingUpstream` (`upstream.py`): it learns which eras the upstream speaks (`eras.py`)
and hands out, per request, either the upstream's own channel (the client's era is spoken: forwarded
unchanged) or a bridge's channel, which translates. `modern_over_legacy.py` carries 2026-07-28
clients onto pooled 2025-11-25 upstream sessions (MRTR for server-to-client requests);
`legacy_over_modern.py` carries 2025-11-25 sessions onto stateless 2026-07-28 requests. Nothing above
the upstream link knows a request was bridged.
"""
