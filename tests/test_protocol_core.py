"""Unit tests of the I/O-free protocol core: message parsing, era rules, the 2026 envelope, HTTP checks."""

from __future__ import annotations

import base64
import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.edge import checks
from gateway.events.stream_frames import recorded_at
from gateway.protocol import jsonrpc
from gateway.protocol.dialect import LEGACY, MODERN
from gateway.protocol.envelope import HeaderValues, check_modern_request, decode_header_value
from gateway.protocol.era import Era
from gateway.protocol.fields import check_fields
from gateway.protocol.jsonrpc import Kind, ProtocolError

ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def headers_of(**values: str | list[str]) -> HeaderValues:
    table = {name.lower().replace("_", "-"): v if isinstance(v, list) else [v] for name, v in values.items()}
    return lambda name: table.get(name.lower(), [])


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", jsonrpc.PARSE_ERROR),
        (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', jsonrpc.INVALID_REQUEST),
        (b'"a string"', jsonrpc.INVALID_REQUEST),
        (b'{"jsonrpc":"1.0","id":1,"method":"ping"}', jsonrpc.INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', jsonrpc.INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', jsonrpc.INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":[1]}', jsonrpc.INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1}', jsonrpc.INVALID_REQUEST),
    ],
)
def test_parse_rejects_bad_messages_with_the_right_code(body: bytes, code: int) -> None:
    with pytest.raises(ProtocolError) as info:
        jsonrpc.parse_message(body)
    assert info.value.code == code
    assert info.value.http_status == 400


def nested(levels: int) -> object:
    """Arrays nested `levels` deep: nested(1) is []."""
    value: object = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [63, 64, 65, 200, 251, 1024, 1025, 5000])
def test_parse_refuses_nesting_deeper_than_the_limit(depth: int) -> None:
    # The message itself is one level: params two, params.x three.
    raw = b'{"jsonrpc":"2.0","id":9,"method":"ping","params":{"x":' + b"[" * depth + b"]" * depth + b"}}"
    if depth + 2 <= 64:
        assert jsonrpc.parse_message(raw, 64)["id"] == 9
        return
    with pytest.raises(ProtocolError) as info:
        jsonrpc.parse_message(raw, 64)
    assert (info.value.code, info.value.http_status) == (jsonrpc.INVALID_REQUEST, 400)
    assert "nested deeper than 64 levels" in info.value.message
    assert info.value.request_id == (9 if depth < 1024 else None)


@given(
    st.recursive(
        st.integers() | st.text(max_size=3),
        lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=2), children, max_size=3),
        max_leaves=40,
    ),
    st.integers(min_value=1, max_value=12),
)
def test_depth_exceeds_agrees_with_a_recursive_definition(value: object, limit: int) -> None:
    def depth(node: object) -> int:
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        return 0 if children is None else 1 + max((depth(child) for child in children), default=0)

    assert jsonrpc.depth_exceeds(value, limit) == (depth(value) > limit)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = "[{" * 500
    raw = jsonrpc.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"code": text, "x": nested(60)}})
    assert jsonrpc.parse_message(raw, 64)["params"]["code"] == text


def test_classify_tells_the_three_kinds_apart() -> None:
    assert jsonrpc.classify({"jsonrpc": "2.0", "id": "a", "method": "tools/list"}) is Kind.REQUEST
    assert jsonrpc.classify({"jsonrpc": "2.0", "method": "notifications/initialized"}) is Kind.NOTIFICATION
    assert jsonrpc.classify({"jsonrpc": "2.0", "id": 3, "result": {}}) is Kind.RESPONSE
    assert jsonrpc.classify({"jsonrpc": "2.0", "id": 3, "error": {"code": 1, "message": "x"}}) is Kind.RESPONSE


def test_parse_keeps_unknown_fields() -> None:
    message = jsonrpc.parse_message(b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"vendor":{"k":[1,2]}},"extra":1}')
    assert message["params"]["vendor"] == {"k": [1, 2]} and message["extra"] == 1


@pytest.mark.parametrize(
    ("header", "era"),
    [(None, Era.LEGACY), ("2024-11-05", Era.LEGACY), ("2025-11-25", Era.LEGACY), ("2026-07-28", Era.MODERN)],
)
def test_era_routing_follows_the_reference_sdk(header: str | None, era: Era) -> None:
    assert Era.for_header(header) is era


def test_unknown_version_header_takes_the_modern_path() -> None:
    assert Era.for_header("1999-01-01") is Era.MODERN


def test_error_status_differs_by_era() -> None:
    not_found = jsonrpc.error_response(1, jsonrpc.METHOD_NOT_FOUND, "x")
    assert Era.LEGACY.status_for_response(not_found) == 200
    assert Era.MODERN.status_for_response(not_found) == 404
    assert Era.MODERN.status_for_response(jsonrpc.error_response(1, jsonrpc.HEADER_MISMATCH, "x")) == 400
    assert Era.MODERN.status_for_response({"jsonrpc": "2.0", "id": 1, "result": {}}) == 200
    assert LEGACY.empty_result == {} and MODERN.empty_result == {"resultType": "complete"}


def _call(name: str = "echo", meta: dict[str, object] | None = None) -> jsonrpc.Message:
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "_meta": meta or ENVELOPE}}


def test_envelope_accepts_a_well_formed_request() -> None:
    check_modern_request(
        _call(), headers_of(mcp_protocol_version="2026-07-28", mcp_method="tools/call", mcp_name="echo")
    )


def test_envelope_missing_keys_is_invalid_params() -> None:
    with pytest.raises(ProtocolError) as info:
        check_modern_request(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
            headers_of(mcp_protocol_version="2026-07-28", mcp_method="tools/list"),
        )
    assert info.value.code == jsonrpc.INVALID_PARAMS and "protocolVersion" in info.value.message


@pytest.mark.parametrize(
    "headers",
    [
        {"mcp_protocol_version": "2025-11-25", "mcp_method": "tools/call", "mcp_name": "echo"},
        {"mcp_protocol_version": "2026-07-28", "mcp_method": "tools/list", "mcp_name": "echo"},
        {"mcp_protocol_version": "2026-07-28", "mcp_method": "tools/call", "mcp_name": "other"},
        {"mcp_protocol_version": "2026-07-28", "mcp_method": "tools/call"},
        {"mcp_protocol_version": "2026-07-28", "mcp_method": ["tools/call", "tools/call"], "mcp_name": "echo"},
    ],
)
def test_envelope_header_disagreement_is_header_mismatch(headers: dict[str, str | list[str]]) -> None:
    with pytest.raises(ProtocolError) as info:
        check_modern_request(_call(), headers_of(**headers))
    assert info.value.code == jsonrpc.HEADER_MISMATCH and info.value.request_id == 7


def test_envelope_unsupported_version_lists_the_supported_ones() -> None:
    meta = {**ENVELOPE, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
    with pytest.raises(ProtocolError) as info:
        check_modern_request(
            _call(meta=meta), headers_of(mcp_protocol_version="2099-01-01", mcp_method="tools/call", mcp_name="echo")
        )
    assert info.value.code == jsonrpc.UNSUPPORTED_PROTOCOL_VERSION
    assert info.value.data == {"supported": ["2026-07-28"], "requested": "2099-01-01"}


def test_envelope_decodes_base64_header_values() -> None:
    name = "résumé"
    encoded = "=?base64?" + base64.b64encode(name.encode()).decode() + "?="
    assert decode_header_value(encoded) == name
    check_modern_request(
        _call(name), headers_of(mcp_protocol_version="2026-07-28", mcp_method="tools/call", mcp_name=encoded)
    )


def test_task_methods_mirror_task_id_in_mcp_name() -> None:
    message = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": "t1", "_meta": ENVELOPE}}
    with pytest.raises(ProtocolError):
        check_modern_request(message, headers_of(mcp_protocol_version="2026-07-28", mcp_method="tasks/get"))
    check_modern_request(message, headers_of(mcp_protocol_version="2026-07-28", mcp_method="tasks/get", mcp_name="t1"))


def test_a_missing_mirrored_param_is_named_in_the_mismatch() -> None:
    message = {"jsonrpc": "2.0", "id": 1, "method": "tasks/stream", "params": {"_meta": ENVELOPE}}
    with pytest.raises(ProtocolError) as info:
        check_modern_request(message, headers_of(mcp_protocol_version="2026-07-28", mcp_method="tasks/stream"))
    assert info.value.code == jsonrpc.HEADER_MISMATCH
    assert info.value.message == (
        "Header mismatch: tasks/stream needs params.taskId (the Mcp-Name header repeats it); the request has none"
    )


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8765", True),
        ("localhost:1", True),
        ("[::1]:80", True),
        ("127.0.0.1", True),  # no port: http's default, which `:*` allows
        ("[::1]", True),
        ("LOCALHOST:8765", True),  # host names compare case-insensitively
        ("LocalHost", True),
        ("evil.com:8765", False),
        ("localhost.evil.com:8765", False),
        ("localhost:*", False),
        ("localhost:", False),
        ("localhost:80x", False),
        ("[::1", False),
        ("[::1]x", False),
        ("", False),
        (None, False),
    ],
)
def test_host_allow_list(host: str | None, ok: bool) -> None:
    allowed = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
    if ok:
        checks.check_host(host, allowed)
    else:
        with pytest.raises(ProtocolError) as info:
            checks.check_host(host, allowed)
        assert info.value.http_status == 421


@pytest.mark.parametrize(
    ("host", "entry", "ok"),
    [
        ("example.com", "example.com:80", True),
        ("example.com:80", "example.com", True),
        ("EXAMPLE.com", "example.COM", True),
        ("example.com", "example.com:443", False),  # a Host without a port is taken as http
        ("example.com:8080", "example.com", False),
        ("anything:1", "*", True),
    ],
)
def test_host_without_port_is_the_default_port(host: str, entry: str, ok: bool) -> None:
    if ok:
        checks.check_host(host, [entry])
    else:
        with pytest.raises(ProtocolError):
            checks.check_host(host, [entry])


def test_origin_absent_passes_foreign_is_403() -> None:
    allowed = ["http://localhost:*", "https://app.example:443"]
    checks.check_origin(None, allowed)
    checks.check_origin("http://localhost:3000", allowed)
    checks.check_origin("http://localhost", allowed)  # browsers omit the default port
    checks.check_origin("HTTP://LocalHost:3000", allowed)
    checks.check_origin("https://app.example", allowed)
    for origin in ("http://localhost.evil.com:3000", "https://localhost", "http://app.example", "null", ""):
        with pytest.raises(ProtocolError) as info:
            checks.check_origin(origin, allowed)
        assert info.value.http_status == 403


@pytest.mark.parametrize(
    ("accept", "ok"),
    [
        ("application/json, text/event-stream", True),
        ("*/*", True),
        ("application/*, text/*", True),
        ("application/json;q=0.9, text/event-stream", True),
        ("application/json", False),
        (None, False),
    ],
)
def test_post_accept_rules(accept: str | None, ok: bool) -> None:
    if ok:
        checks.check_accept_post(accept)
    else:
        with pytest.raises(ProtocolError) as info:
            checks.check_accept_post(accept)
        assert info.value.http_status == 406


def test_content_type_must_be_json() -> None:
    checks.check_content_type("application/json; charset=utf-8")
    for bad in ("text/plain", None, "application/jsonl"):
        with pytest.raises(ProtocolError) as info:
            checks.check_content_type(bad)
        assert info.value.http_status == 415


def test_recorded_at_is_utc_iso8601_with_milliseconds() -> None:
    assert recorded_at(0.0) == b"1970-01-01T00:00:00.000Z"
    assert recorded_at(1796118180.1234) == b"2026-12-01T09:43:00.123Z"
    # Rounding carries into the next second rather than printing .1000.
    assert recorded_at(1796118180.9996) == b"2026-12-01T09:43:01.000Z"


@given(st.lists(st.floats(min_value=1.5e9, max_value=4e9), min_size=2, max_size=20))
def test_recorded_at_keeps_order_and_is_within_half_a_millisecond(times: list[float]) -> None:
    times.sort()
    texts = [recorded_at(t).decode() for t in times]
    assert texts == sorted(texts)
    for t, text in zip(times, texts, strict=True):
        parsed = datetime.datetime.fromisoformat(text).timestamp()
        assert abs(parsed - t) <= 0.0005 + 1e-6, (t, text)


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"method": "tools/call", "params": {"name": "echo", "_meta": "x"}}, "params._meta"),
        ({"method": "ping", "params": {"_meta": {"progressToken": [1]}}}, "params._meta.progressToken"),
        ({"method": "ping", "params": {"_meta": {"progressToken": True}}}, "params._meta.progressToken"),
        ({"method": "tools/call", "params": {"name": 5}}, "params.name"),
        ({"method": "tools/call", "params": {"name": "echo", "arguments": [1]}}, "params.arguments"),
        ({"method": "tools/call", "params": {"name": "echo", "task": 5}}, "params.task"),
        ({"method": "tools/call", "params": {"name": "echo", "task": {"ttl": "1"}}}, "params.task.ttl"),
        ({"method": "tasks/get", "params": {"taskId": 5}}, "params.taskId"),
        ({"method": "tasks/list", "params": {"cursor": {}}}, "params.cursor"),
        ({"method": "tasks/update", "params": {"taskId": "t", "inputResponses": []}}, "params.inputResponses"),
        ({"method": "notifications/cancelled", "params": {"requestId": [1]}}, "params.requestId"),
    ],
)
def test_fields_the_gateway_reads_must_have_their_type(message: dict[str, object], field: str) -> None:
    request = {"jsonrpc": "2.0", "id": 4, **message}
    with pytest.raises(ProtocolError) as info:
        check_fields(request)
    assert (info.value.code, info.value.http_status, info.value.request_id) == (jsonrpc.INVALID_PARAMS, 400, 4)
    assert info.value.message.startswith(f"Invalid params: {field} must be "), info.value.message


def test_absent_and_well_typed_fields_pass() -> None:
    for params in (
        {},
        {"name": "echo", "arguments": {}, "task": {"ttl": 1.5}, "_meta": {"progressToken": 3}},
        {"unknown": [[[]]], "_meta": {"vendor/x": None}},
    ):
        check_fields({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
    check_fields({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "r"}})
    check_fields({"jsonrpc": "2.0", "id": 1, "method": "vendor/anything", "params": {"name": 5, "taskId": []}})
