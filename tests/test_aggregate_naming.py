"""The aggregate's naming (pure): prefixed names and task ids, list cursors, merged capabilities and
instructions, and which upstream owns a resource URI."""

from __future__ import annotations

import base64
import logging

import orjson
import pytest

from gateway.upstream.aggregate.naming import (
    CursorError,
    Names,
    merge_capabilities,
    merge_instructions,
    template_pattern,
)
from gateway.upstream.aggregate.resources import ResourceOwners

NAMES = Names(["build", "time", "build-x"], "__")


def test_a_prefixed_name_splits_back_into_its_upstream_and_name() -> None:
    assert NAMES.prefixed("build", "echo") == "build__echo"
    assert NAMES.split("build__echo") == ("build", "echo")
    assert NAMES.split("time__get_current_time") == ("time", "get_current_time")
    # The name itself may hold the separator; the longest upstream name that fits wins.
    assert NAMES.split("build__a__b") == ("build", "a__b")
    assert NAMES.split("build-x__echo") == ("build-x", "echo")


@pytest.mark.parametrize("name", ["echo", "nope__echo", "build__", "build_echo", "", "__echo", "Build__echo"])
def test_a_name_no_upstream_owns_splits_to_none(name: str) -> None:
    assert NAMES.split(name) is None


def test_task_ids_and_request_states_are_prefixed_the_same_way() -> None:
    assert NAMES.split(NAMES.prefixed("time", "5f0c-task")) == ("time", "5f0c-task")


def test_a_cursor_names_each_upstream_whose_list_goes_on_and_its_own_cursor() -> None:
    for pending in [[("build", "1")], [("time", "abc=="), ("build-x", "x" * 300)]]:
        encoded = NAMES.encode_cursor(pending)
        assert "=" not in encoded and "/" not in encoded and "+" not in encoded
        assert NAMES.decode_cursor(encoded) == pending


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "not base64 at all!",
        _b64(b"not json"),
        _b64(b"[1, 2]"),
        _b64(orjson.dumps({"p": []})),
        _b64(orjson.dumps({"p": [["build", "1"]], "x": 1})),
        _b64(orjson.dumps({"p": [[3, "1"]]})),
        _b64(orjson.dumps({"p": [["build", 5]]})),
        _b64(orjson.dumps({"p": [["build"]]})),
        _b64(orjson.dumps({"p": [["build", None]]})),
    ],
)
def test_a_cursor_the_aggregate_did_not_make_is_refused(cursor: str) -> None:
    with pytest.raises(CursorError, match="not one this server gave out"):
        NAMES.decode_cursor(cursor)


def test_a_cursor_naming_an_unknown_upstream_is_refused_with_its_name() -> None:
    forged = _b64(orjson.dumps({"p": [["build", "1"], ["search", "2"]]}))
    with pytest.raises(CursorError, match="unknown upstream 'search'"):
        NAMES.decode_cursor(forged)
    assert issubclass(CursorError, ValueError)


def test_capabilities_merge_as_a_union_where_a_flag_is_true_if_any_is() -> None:
    merged = merge_capabilities(
        [
            {"tools": {"listChanged": False}, "logging": {}},
            {"tools": {"listChanged": True}, "resources": {"subscribe": True}},
            {"tools": {}, "resources": {"listChanged": True, "subscribe": False}, "tasks": {"list": {}}},
        ]
    )
    assert merged == {
        "tools": {"listChanged": True},
        "logging": {},
        "resources": {"subscribe": True, "listChanged": True},
        "tasks": {"list": {}},
    }
    assert merge_capabilities([]) == {}


def test_instructions_are_concatenated_under_a_heading_per_upstream() -> None:
    text = merge_instructions([("build", "Builds things."), ("time", None), ("search", "Finds.")])
    assert text == "## build\n\nBuilds things.\n\n## search\n\nFinds."
    assert merge_instructions([("build", None), ("time", "")]) is None


def test_a_prefixed_tool_name_must_stay_a_valid_tool_name() -> None:
    assert NAMES.valid_tool_name(NAMES.prefixed("build", "run.tests-v2"))
    assert not NAMES.valid_tool_name(NAMES.prefixed("build", "x" * 122))  # 129 characters
    assert NAMES.valid_tool_name(NAMES.prefixed("build", "x" * 121))  # 128
    assert not NAMES.valid_tool_name(NAMES.prefixed("build", "has space"))
    assert not NAMES.valid_tool_name(NAMES.prefixed("build", "ünïcode"))


def test_a_uri_template_matches_one_segment_per_variable() -> None:
    pattern = template_pattern("build://logs/{build_id}")
    assert pattern.fullmatch("build://logs/1001")
    assert not pattern.fullmatch("build://logs/1001/extra")
    assert not pattern.fullmatch("build://other/1001")
    assert template_pattern("x://a.{b}").fullmatch("x://a.c")
    assert not template_pattern("x://a.{b}").fullmatch("x://aXc")


def test_the_first_configured_upstream_owns_a_uri_two_claim_and_the_clash_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owners = ResourceOwners(NAMES)
    owners.learn("time", "uri", [{"uri": "shared://a"}, {"uri": "time://only"}])
    with caplog.at_level(logging.WARNING, logger="gateway.upstream.aggregate"):
        owners.learn("build", "uri", [{"uri": "shared://a"}, {"uri": "build://only"}, {"no": "uri"}])
        owners.learn("build", "uri", [{"uri": "shared://a"}])
        owners.learn("time", "uri", [{"uri": "shared://a"}])
    assert owners.owner("shared://a") == "build"
    assert owners.owner("time://only") == "time"
    assert owners.owner("build://only") == "build"
    assert owners.owner("nobody://x") is None
    assert len([r for r in caplog.records if "two upstreams" in r.getMessage()]) == 1
    owners.learn("build-x", "uriTemplate", [{"uriTemplate": "build://logs/{id}"}])
    assert owners.owner("build://logs/7") == "build-x"
    assert owners.owner("build://logs/{id}") == "build-x"
