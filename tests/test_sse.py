"""SSE framing: the encoders and the incremental parser (WHATWG rules, chunk boundaries anywhere)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocol.sse import SseError, SseEvent, SseParser, encode_comment, encode_message, encode_priming

# Frames as an SDK server with an EventStore sends them (wire-facts §2.3 and §2.5): a priming event,
# a log, progress with ids, a keep-alive comment, a fresh priming event, and the response.
LOG = (
    '{"jsonrpc":"2.0","method":"notifications/message",'
    '"params":{"level":"info","logger":"builder","data":"build started: 3 steps"}}'
)
PROGRESS = (
    '{"jsonrpc":"2.0","method":"notifications/progress",'
    '"params":{"progressToken":2,"progress":1,"total":4,"message":"step 1/4 \u00e9\u2713"}}'
)
RESULT = '{"jsonrpc":"2.0","id":2,"result":{"content":[{"text":"survived 4 steps","type":"text"}],"isError":false}}'
PAYLOAD = (
    b"id: 2:3\r\ndata: \r\nretry: 300\r\n\r\n"
    b"event: message\r\ndata: " + LOG.encode() + b"\r\n\r\n"
    b"id: 2:4\r\nevent: message\r\ndata: " + PROGRESS.encode() + b"\r\n\r\n"
    b": ping - 2026-11-30 03:15:43.722671+00:00\r\n\r\n"
    b"id: 2:6\r\ndata: \r\nretry: 300\r\n\r\n"
    b"id: 2:9\r\nevent: message\r\ndata: " + RESULT.encode() + b"\r\n\r\n"
)
EXPECTED = [
    SseEvent(data="", id="2:3", retry=300),
    SseEvent(data=LOG),
    SseEvent(data=PROGRESS, id="2:4"),
    SseEvent(data="", id="2:6", retry=300),
    SseEvent(data=RESULT, id="2:9"),
]


def feed_all(parser: SseParser, chunks: list[bytes]) -> list[SseEvent]:
    return [event for chunk in chunks for event in parser.feed(chunk)]


def test_realistic_payload_in_one_chunk() -> None:
    parser = SseParser()
    assert parser.feed(PAYLOAD) == EXPECTED
    assert parser.last_event_id == "2:9"
    assert parser.retry_ms == 300


@pytest.mark.parametrize("line_end", [b"\n", b"\r"])
def test_lf_and_cr_line_endings(line_end: bytes) -> None:
    parser = SseParser()
    assert parser.feed(PAYLOAD.replace(b"\r\n", line_end)) == EXPECTED


def test_split_at_every_byte_offset() -> None:
    for offset in range(len(PAYLOAD) + 1):
        parser = SseParser()
        assert feed_all(parser, [PAYLOAD[:offset], PAYLOAD[offset:]]) == EXPECTED, offset


def test_byte_by_byte() -> None:
    parser = SseParser()
    assert feed_all(parser, [PAYLOAD[i : i + 1] for i in range(len(PAYLOAD))]) == EXPECTED


def test_cr_at_end_of_chunk_and_lf_at_start_of_next_is_one_line_end() -> None:
    parser = SseParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\n") == []
    assert parser.feed(b"\r") == [SseEvent(data="a")]
    assert parser.feed(b"\ndata: b\r\n\r\n") == [SseEvent(data="b")]


def test_cr_then_cr_is_two_line_ends() -> None:
    parser = SseParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\rdata: b\n\n") == [SseEvent(data="a"), SseEvent(data="b")]


def test_several_events_in_one_chunk_and_one_event_over_many() -> None:
    parser = SseParser()
    assert parser.feed(b"data: 1\n\ndata: 2\n\nda") == [SseEvent(data="1"), SseEvent(data="2")]
    assert parser.feed(b"ta: 3") == []
    assert parser.feed(b"\n") == []
    assert parser.feed(b"\n") == [SseEvent(data="3")]


def test_multi_line_data_is_joined_with_newlines() -> None:
    parser = SseParser()
    assert parser.feed(b"data: first\ndata:second\ndata\ndata:  indented\n\n") == [
        SseEvent(data="first\nsecond\n\n indented")
    ]


def test_comments_and_comment_only_blocks_are_ignored() -> None:
    parser = SseParser()
    assert parser.feed(b": ping\r\n\r\n:\n\ndata: x\n: inside\n\n") == [SseEvent(data="x")]


def test_block_without_data_id_or_retry_is_not_dispatched() -> None:
    parser = SseParser()
    assert parser.feed(b"event: custom\n\nunknown: field\n\n\n\n") == []


def test_event_type_and_field_rules() -> None:
    parser = SseParser()
    events = parser.feed(b"event: custom\ndata:x\nid\n\nevent\ndata: y\nretry: 12a\n\n")
    assert events == [SseEvent(data="x", event="custom", id=""), SseEvent(data="y")]
    assert parser.last_event_id == ""
    assert parser.retry_ms is None


def test_priming_event_is_returned_with_empty_data() -> None:
    parser = SseParser()
    assert parser.feed(b"id: 7\ndata:\n\n") == [SseEvent(data="", id="7")]
    assert parser.feed(b"retry: 250\n\n") == [SseEvent(data="", retry=250)]
    assert parser.last_event_id == "7"
    assert parser.retry_ms == 250


def test_id_persists_until_changed_and_nul_ids_are_ignored() -> None:
    parser = SseParser()
    parser.feed(b"id: a\ndata: 1\n\n")
    assert parser.feed(b"data: 2\n\n") == [SseEvent(data="2")]
    assert parser.last_event_id == "a"
    assert parser.feed(b"id: b\x00c\ndata: 3\n\n") == [SseEvent(data="3")]
    assert parser.last_event_id == "a"


def test_retry_must_be_ascii_digits() -> None:
    parser = SseParser()
    parser.feed("retry: \u00b2\n\nretry: -1\n\nretry: 1.5\n\n".encode())
    assert parser.retry_ms is None


def test_leading_bom_is_stripped() -> None:
    parser = SseParser()
    assert feed_all(parser, [b"\xef\xbb", b"\xbfdata: x\n\n"]) == [SseEvent(data="x")]


def test_multibyte_character_split_across_chunks() -> None:
    raw = "data: \u00e9\u2713\U0001f600\n\n".encode()
    for offset in range(len(raw) + 1):
        parser = SseParser()
        assert feed_all(parser, [raw[:offset], raw[offset:]]) == [SseEvent(data="\u00e9\u2713\U0001f600")]


def test_event_size_limit() -> None:
    parser = SseParser(max_event_bytes=16)
    assert parser.feed(b"data: 0123456789\n\n") == [SseEvent(data="0123456789")]
    with pytest.raises(SseError):
        parser.feed(b"data: 0123456789\ndata: 0123456789\n")
    with pytest.raises(SseError):
        SseParser(max_event_bytes=16).feed(b"data: 01234567890123456789")


def test_encoders_round_trip() -> None:
    assert SseParser().feed(encode_message(b"{}", "3_7") + encode_priming("3_8", 250)) == [
        SseEvent(data="{}", id="3_7"),
        SseEvent(data="", id="3_8", retry=250),
    ]
    frame = encode_message(RESULT.encode())
    assert frame == b"event: message\r\ndata: " + RESULT.encode() + b"\r\n\r\n"
    assert encode_comment("keepalive") == b": keepalive\r\n\r\n"
    parser = SseParser()
    assert parser.feed(encode_comment("keepalive") + frame + encode_message(b"{}")) == [
        SseEvent(data=RESULT),
        SseEvent(data="{}"),
    ]


# -- property: chunking never changes the events ------------------------------------------------


@dataclass
class Spec:
    data: list[str]
    id: str | None
    event: str | None
    comment: str | None
    retry: int | None


_value = st.text(st.characters(exclude_characters="\r\n\x00", codec="utf-8"), max_size=12)
_spec = st.builds(
    Spec,
    data=st.lists(_value, min_size=1, max_size=3),
    id=st.none() | _value,
    event=st.none() | st.sampled_from(["message", "custom"]),
    comment=st.none() | _value,
    retry=st.none() | st.integers(min_value=0, max_value=10**6),
)


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[SseEvent]]:
    """A valid stream with one line ending throughout, and the events it must parse to."""
    line_end = draw(st.sampled_from(["\r\n", "\n", "\r"]))
    lines: list[str] = []
    expected: list[SseEvent] = []
    for spec in draw(st.lists(_spec, max_size=6)):
        if spec.comment is not None:
            lines.append(":" + spec.comment)
        if spec.event is not None:
            lines.append("event: " + spec.event)
        if spec.id is not None:
            lines.append("id: " + spec.id)
        if spec.retry is not None:
            lines.append(f"retry: {spec.retry}")
        lines.extend("data: " + value for value in spec.data)
        lines.append("")
        expected.append(
            SseEvent(data="\n".join(spec.data), event=spec.event or "message", id=spec.id, retry=spec.retry)
        )
    raw = "".join(line + line_end for line in lines).encode()
    return raw, expected


@settings(max_examples=300, deadline=None)
@given(stream=streams(), cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_chunking_yields_the_same_events(stream: tuple[bytes, list[SseEvent]], cuts: list[int]) -> None:
    raw, expected = stream
    points = sorted({cut % (len(raw) + 1) for cut in cuts})
    chunks = [raw[start:end] for start, end in zip([0, *points], [*points, len(raw)], strict=True)]
    assert SseParser().feed(raw) == expected
    assert feed_all(SseParser(), chunks) == expected


def test_events_carry_their_size_on_the_wire() -> None:
    parser = SseParser()
    raw = 'event: message\r\ndata: {"text": "é"}\r\n\r\n'.encode()
    (event,) = parser.feed(raw[:9]) + parser.feed(raw[9:])
    assert event.size == len(raw.replace(b"\r\n", b"\n"))
    (second,) = parser.feed(b"data: x\n\n")
    assert second.size == len(b"data: x\n\n")
