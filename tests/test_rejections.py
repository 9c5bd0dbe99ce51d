"""Unit tests of the quiet refusal log: rate limiting, reasons, and aiohttp's framing records."""

from __future__ import annotations

import logging

import pytest
from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine, InvalidHeader, LineTooLong

from gateway.edge.rejections import FramingErrors, RateLimitedLog, Rejections, describe_malformed, reason_of
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import ProtocolError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_kind_per_interval_then_a_count_of_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger("test.rejections"), 60.0, clock)
    with caplog.at_level(logging.INFO, "test.rejections"):
        for second in range(120):
            clock.now = float(second)
            limited.log(logging.WARNING, "host", "bad host")
            limited.log(logging.WARNING, "origin", "bad origin")
    lines = [(record.reason, record.getMessage()) for record in caplog.records]  # type: ignore[attr-defined]
    assert lines == [
        ("host", "bad host"),
        ("origin", "bad origin"),
        ("host", "bad host (and 59 more not logged in the last 60 s)"),
        ("origin", "bad origin (and 59 more not logged in the last 60 s)"),
    ]


def test_reasons_are_a_small_fixed_set() -> None:
    assert reason_of(ProtocolError(jsonrpc.INVALID_REQUEST, "x", http_status=421)) == "host"
    assert reason_of(ProtocolError(jsonrpc.PARSE_ERROR, "x")) == "parse_error"
    assert reason_of(ProtocolError(jsonrpc.INVALID_PARAMS, "x")) == "invalid_params"
    assert reason_of(ProtocolError(-1, "x")) == "invalid"


def test_framing_records_become_counted_warnings_other_records_pass(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    framing = FramingErrors(Rejections(metrics, 60.0))

    def record(error: Exception) -> logging.LogRecord:
        return logging.LogRecord(
            "aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s", ("1.2.3.4",),
            (type(error), error, None),
        )  # fmt: skip

    with caplog.at_level(logging.INFO, "gateway.edge.rejected"):
        assert framing.filter(record(BadHttpMessage("Invalid character in chunk size:\n\n  b'zz'"))) is False
        assert framing.filter(record(RuntimeError("a gateway bug"))) is True
    assert metrics.registry.get_sample_value("mcp_gateway_rejected_requests_total", {"reason": "framing"}) == 1
    (line,) = caplog.records
    assert line.levelno == logging.WARNING and line.exc_info is None
    assert line.getMessage() == "malformed HTTP request: Invalid character in chunk size"


@pytest.mark.parametrize(
    ("error", "description"),
    [
        (LineTooLong(b"Bearer SECRET-TOKEN" + b"A" * 90 + b"...", 8190), "Got more than 8190 bytes when reading"),
        (
            BadHttpMessage("Invalid header value char:\n\n  b'Authorization: Bearer SECRET\\x01'"),
            "Invalid header value char",
        ),
        (InvalidHeader(b"Authorization: SECRET"), "Invalid HTTP header"),
        (BadStatusLine("GET /?token=SECRET HTTP/1.1"), "Bad status line"),
        (BadHttpMessage(""), "BadHttpMessage"),
    ],
)
def test_a_malformed_request_is_described_without_quoting_it(error: BadHttpMessage, description: str) -> None:
    assert describe_malformed(error) == description
