"""The modern bridge's pure parts, in process: the sealed `requestState` and the shape translations."""

from __future__ import annotations

from typing import Any

from gateway.protocol.dialect import LOG_LEVEL_KEY
from gateway.protocol.era import CLIENT_CAPABILITIES_KEY, CLIENT_INFO_KEY, PROTOCOL_VERSION_KEY, SERVER_INFO_KEY
from gateway.upstream.bridge import translate
from gateway.upstream.bridge.request_state import RequestStateSealer
from gateway.upstream.bridge.session_pool import session_key

NOW = 1_000_000.0
INFO = {"name": "up", "version": "1"}


# -- requestState ------------------------------------------------------------------------------------


def test_a_sealed_state_opens_for_its_owner_until_it_expires() -> None:
    sealer = RequestStateSealer()
    state = sealer.seal("call-1", "alice", NOW + 10)
    opened = sealer.open(state, "alice", NOW)
    assert opened is not None and opened.call_id == "call-1"
    assert sealer.open(state, "alice", NOW + 10) is None  # expired
    assert "alice" not in state  # bound by the MAC, not carried


def test_tampered_foreign_and_malformed_states_do_not_open() -> None:
    sealer = RequestStateSealer()
    state = sealer.seal("call-1", "alice", NOW + 10)
    body, mac = state.removeprefix("mtg1.").split(".")
    forged_body = RequestStateSealer().seal("call-2", "alice", NOW + 10).removeprefix("mtg1.").split(".")[0]
    for bad in (
        f"mtg1.{forged_body}.{mac}",  # another call's payload under this MAC
        state[:-1] + ("A" if state[-1] != "A" else "B"),
        "mtg1." + body,
        "mtg1.%%%.***",
        "opaque",
        "",
        None,
        42,
    ):
        assert sealer.open(bad, "alice", NOW) is None, bad
    assert sealer.open(state, "bob", NOW) is None  # another principal's
    assert RequestStateSealer().open(state, "alice", NOW) is None  # another process's key


# -- requests ---------------------------------------------------------------------------------------


def modern_request(meta: dict[str, Any]) -> dict[str, Any]:
    envelope = {PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {"sampling": {}, "extensions": {"x": {}}}}
    return {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "t", "arguments": {"a": 1}, "_meta": {**envelope, **meta}},
    }


def test_a_request_loses_its_envelope_and_gets_the_sessions_id_and_token() -> None:
    message = modern_request({LOG_LEVEL_KEY: "info", "progressToken": "p", "traceparent": "00-ab"})
    legacy = translate.legacy_request(message, "bridge-3")
    assert legacy == {
        "jsonrpc": "2.0",
        "id": "bridge-3",
        "method": "tools/call",
        "params": {"name": "t", "arguments": {"a": 1}, "_meta": {"progressToken": "bridge-3", "traceparent": "00-ab"}},
    }
    assert "_meta" not in translate.legacy_request(modern_request({}), 1)["params"]


def test_the_session_declares_the_clients_legacy_capabilities_and_its_info() -> None:
    message = modern_request({CLIENT_INFO_KEY: {"name": "c", "version": "2"}})
    initialize = translate.initialize_request("bridge-1", message, "2025-11-25")
    assert initialize["params"] == {
        "protocolVersion": "2025-11-25",
        "capabilities": {"sampling": {}},
        "clientInfo": {"name": "c", "version": "2"},
    }
    assert (
        translate.initialize_request(1, modern_request({}), "v")["params"]["clientInfo"]
        == translate.GATEWAY_CLIENT_INFO
    )


def test_sessions_are_keyed_by_owner_and_canonical_capabilities() -> None:
    one = modern_request({CLIENT_CAPABILITIES_KEY: {"sampling": {}, "roots": {}}})
    same = modern_request({CLIENT_CAPABILITIES_KEY: {"roots": {}, "sampling": {}}})
    assert session_key("a", one) == session_key("a", same)
    assert session_key("a", one) != session_key("b", one)
    assert session_key("a", one) != session_key("a", modern_request({}))


def test_log_levels_are_filtered_per_request() -> None:
    warning = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "warning", "data": "x"}}
    debug = {**warning, "params": {"level": "debug", "data": "y"}}
    threshold = translate.log_level(modern_request({LOG_LEVEL_KEY: "info"}))
    assert translate.wants_log(warning, threshold) and not translate.wants_log(debug, threshold)
    assert not translate.wants_log(warning, translate.log_level(modern_request({})))


# -- responses --------------------------------------------------------------------------------------


def test_results_become_complete_and_cacheable_ones_private() -> None:
    listed = translate.modern_final(
        {"jsonrpc": "2.0", "id": "bridge-1", "result": {"tools": []}}, 7, "tools/list", INFO
    )
    assert listed == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {
            "tools": [],
            "resultType": "complete",
            "ttlMs": 0,
            "cacheScope": "private",
            "_meta": {SERVER_INFO_KEY: INFO},
        },
    }
    called = translate.modern_final({"id": 1, "result": {"content": [], "_meta": {"k": 1}}}, 7, "tools/call", INFO)
    assert called["result"] == {
        "content": [],
        "resultType": "complete",
        "_meta": {"k": 1, SERVER_INFO_KEY: INFO},
    }


def test_a_resource_not_found_error_gets_the_2026_code() -> None:
    error = {"code": -32002, "message": "Resource not found", "data": {"uri": "x"}}
    final = translate.modern_final({"id": 1, "error": error}, 7, "resources/read", INFO)
    assert final == {"jsonrpc": "2.0", "id": 7, "error": {**error, "code": -32602}}
    other = {"code": -32603, "message": "boom"}
    assert translate.modern_final({"id": 1, "error": other}, 7, "tools/call", INFO)["error"] == other


def test_discover_is_the_initialize_result_without_legacy_tasks() -> None:
    initialized = {
        "protocolVersion": "2025-11-25",
        "capabilities": {"tools": {"listChanged": True}, "tasks": {"list": {}}, "logging": {}},
        "serverInfo": INFO,
        "instructions": "be nice",
    }
    assert translate.discover_result(initialized) == {
        "resultType": "complete",
        "supportedVersions": ["2026-07-28"],
        "capabilities": {"tools": {"listChanged": True}, "logging": {}},
        "instructions": "be nice",
        "ttlMs": 0,
        "cacheScope": "private",
        "_meta": {SERVER_INFO_KEY: INFO},
    }


def test_server_requests_become_input_requests_and_answers_responses() -> None:
    elicit = {
        "jsonrpc": "2.0",
        "id": 4,
        "method": "elicitation/create",
        "params": {"message": "?", "requestedSchema": {}},
    }
    assert translate.input_request(elicit) == {
        "method": "elicitation/create",
        "params": {"message": "?", "requestedSchema": {}, "mode": "form"},
    }
    assert translate.input_request({"id": 5, "method": "roots/list"}) == {"method": "roots/list", "params": {}}
    answer = translate.input_response(4, {"action": "accept", "content": {"a": 1}, "resultType": "complete"})
    assert answer == {"jsonrpc": "2.0", "id": 4, "result": {"action": "accept", "content": {"a": 1}}}


def test_an_unknown_session_is_recognised_in_the_typescript_examples_words() -> None:
    unknown = {"code": -32000, "message": "Bad Request: No valid session ID provided"}
    assert translate.says_session_unknown({"id": 1, "error": unknown})
    assert not translate.says_session_unknown({"id": 1, "error": {"code": -32602, "message": "no such session"}})
    assert not translate.says_session_unknown({"id": 1, "result": {"content": []}})
