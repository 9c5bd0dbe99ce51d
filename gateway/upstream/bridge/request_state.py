"""The `requestState` the modern bridge hands a 2026-07-28 client whose call waits for its input.

A sealed state names one held upstream call and when it stops being accepted, authenticated with
HMAC-SHA256 under a key made at random when the process starts (`secrets`): a state is good only in
the process that issued it (which is the one holding the call), and it is bound to the principal it
was issued to without carrying the principal. Opening a state that is malformed, tampered with,
another principal's or expired gives None, one answer for all of them, so a state cannot be probed.
Pure: no I/O, the clock is passed in.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass

import orjson

PREFIX = "mtg1."
"""Marks the gateway's own states (and their format's version)."""


@dataclass(frozen=True, slots=True)
class SealedState:
    """What an authentic, unexpired state says: the held call it names."""

    call_id: str
    expires_at: float


class RequestStateSealer:
    """Seals and opens `requestState` strings under one per-process key."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)

    def seal(self, call_id: str, owner: str | None, expires_at: float) -> str:
        payload = orjson.dumps({"c": call_id, "e": round(expires_at, 3)})
        return PREFIX + _b64(payload) + "." + _b64(self._mac(payload, owner))

    def open(self, state: object, owner: str | None, now: float) -> SealedState | None:
        """The held call `state` names, if it is authentic, `owner`'s and not expired at `now`."""
        if not isinstance(state, str) or not state.startswith(PREFIX):
            return None
        body, _, mac = state[len(PREFIX) :].partition(".")
        try:
            payload, given = _unb64(body), _unb64(mac)
        except (binascii.Error, ValueError):
            return None
        if not hmac.compare_digest(given, self._mac(payload, owner)):
            return None
        try:
            fields = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        call_id, expires_at = fields.get("c"), fields.get("e")
        if not isinstance(call_id, str) or not isinstance(expires_at, int | float) or now >= expires_at:
            return None
        return SealedState(call_id, float(expires_at))

    def _mac(self, payload: bytes, owner: str | None) -> bytes:
        # The owner is bound by the MAC alone: the state does not show whose it is.
        bound = payload + b"\x00" + (owner or "").encode()
        return hmac.new(self._key, bound, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    """The bytes `text` encodes; ValueError unless it is their one canonical encoding (a last character
    that differs only in its unused bits would otherwise decode to the same bytes)."""
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(data) != text:
        raise ValueError("not canonical base64url")
    return data
