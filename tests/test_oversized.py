"""Unit tests of attributing an over-long upstream line to its request from a bounded head and tail."""

from __future__ import annotations

import orjson
import pytest

from gateway.protocol.oversized import HEAD_BYTES, TAIL_BYTES, response_id, top_level_members

BIG = "x" * 100_000


def split(line: bytes) -> tuple[bytes, bytes]:
    """What the stdio reader keeps of an over-long line."""
    return line[:HEAD_BYTES], line[-TAIL_BYTES:]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # The Python SDK: jsonrpc, id, result.
        (b'{"jsonrpc":"2.0","id":17,"result":{"content":[{"type":"text","text":"' + BIG.encode() + b'"}]}}', 17),
        (b'{"id":3,"error":{"code":-32603,"message":"' + BIG.encode() + b'"}}', 3),
        # The TypeScript SDK: result first, the id last.
        (b'{"result":{"content":[{"type":"text","text":"' + BIG.encode() + b'"}]},"jsonrpc":"2.0","id":42}', 42),
        (b'{ "result" : "' + BIG.encode() + b'" ,\n "jsonrpc" : "2.0" , "id" : 9 }\r', 9),
        # An id nested in the result is not the response's, wherever it appears.
        (b'{"result":{"id":5,"text":"' + BIG.encode() + b'"},"jsonrpc":"2.0","id":6}', 6),
        (b'{"jsonrpc":"2.0","result":{"items":[{"id":5}],"text":"' + BIG.encode() + b'"}}', None),
        # Escaped quotes and braces in strings before the id do not confuse the scan.
        (b'{"jsonrpc":"2.0","note":"a \\"}\\" {[","id":8,"result":"' + BIG.encode() + b'"}', 8),
        # Not responses: a notification, a server request (whose id is the server's, not the gateway's).
        (b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"' + BIG.encode() + b'"}}', None),
        (b'{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{"m":"' + BIG.encode() + b'"}}', None),
        (b'{"params":{"m":"' + BIG.encode() + b'"},"method":"sampling/createMessage","jsonrpc":"2.0","id":1}', None),
        # Ids the gateway never sends upstream (it numbers its requests 1, 2, ...).
        (b'{"jsonrpc":"2.0","id":"abc","result":"' + BIG.encode() + b'"}', None),
        (b'{"jsonrpc":"2.0","id":-1,"result":"' + BIG.encode() + b'"}', None),
        # A response whose id is in neither part, and lines that are not JSON objects.
        (b'{"jsonrpc":"2.0","result":"' + BIG.encode() + b'","id":4,"extra":"' + BIG.encode() + b'"}', None),
        (b"[" + BIG.encode() + b"]", None),
        (BIG.encode(), None),
    ],
)
def test_response_id(line: bytes, expected: int | None) -> None:
    assert response_id(*split(line)) == expected


def test_members_of_a_cut_head_stop_at_the_cut() -> None:
    head = b'{"jsonrpc":"2.0","id":12,"result":{"content":[{"text":"xx'
    assert top_level_members(head) == {"jsonrpc": None, "id": b"12", "result": None}
    assert top_level_members(b'{"jsonrpc":"2.0","id":12') == {"jsonrpc": None, "id": None}  # 12 may go on
    assert top_level_members(b'{"a":true,"b":null,"c":[1,{"d":2}],"e":1.5e3}') == {
        "a": b"true",
        "b": b"null",
        "c": None,
        "e": b"1.5e3",
    }


def test_a_key_with_escapes_is_decoded() -> None:
    assert list(top_level_members(b'{"\\u0069d":1,"x":2}')) == ["id", "x"]


def test_the_scan_agrees_with_a_json_parser_on_whole_objects() -> None:
    message = {"jsonrpc": "2.0", "id": 5, "result": {"nested": {"id": 1, "s": 'q"}]'}}, "n": [1, [2, {"id": 3}]]}
    members = top_level_members(orjson.dumps(message) + b" ")
    assert list(members) == list(message) and members["id"] == b"5"
