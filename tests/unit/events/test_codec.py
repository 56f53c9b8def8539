from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.events import codec, subjects
from grid.events.codec import TAGS, EventDecodeError
from tests.golden.examples import EXAMPLES, GOLDEN_DIR, tag_of


def test_every_tag_has_a_frozen_golden_payload() -> None:
    assert {p.stem for p in GOLDEN_DIR.glob("*.json")} >= set(TAGS)


@pytest.mark.parametrize("path", sorted(GOLDEN_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_golden_payload_decodes_to_current_type(path) -> None:
    event = codec.decode(path.read_bytes())
    assert tag_of(event) in TAGS
    assert type(event) is TAGS[path.stem] or path.stem in codec.UPCASTERS


@pytest.mark.parametrize("event", EXAMPLES, ids=tag_of)
def test_round_trip_is_byte_stable(event) -> None:
    data = codec.encode(event)
    assert codec.decode(data) == event
    assert codec.encode(codec.decode(data)) == data


def test_every_event_type_has_exactly_one_subject_family() -> None:
    for event in EXAMPLES:
        subject = subjects.subject_for(event)
        parsed = subjects.parse_subject(subject)
        assert parsed.stream == subjects.stream_for_subject(subject)


@pytest.mark.parametrize(
    "data, fragment",
    [
        (b"{not json", "malformed"),
        (b'{"type": "host.heartbeat.v9", "event_id": "x", "at": 1}', "unknown event tag"),
        (b'{"type": "host.heartbeat.v1", "event_id": "x"}', "invalid event payload"),
        (b'{"type": "host.ack.v1", "event_id": "x", "at": 1, "host_id": "h", "action_id": "a", "status": "bogus"}', "invalid"),
        (b"[]", "invalid"),
        (b"", "malformed"),
    ],
)
def test_bad_payloads_raise_a_typed_error(data: bytes, fragment: str) -> None:
    with pytest.raises(EventDecodeError) as info:
        codec.decode(data)
    assert fragment in str(info.value)


def test_upcaster_chain_converts_old_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    # A hypothetical v0 tick request renamed its field; the chain upcasts it one step at a time.
    def v0_to_v1(payload: dict) -> dict:
        return {"type": "control.tick_requested.v1", "event_id": payload["event_id"], "at": payload["at"], "reason": payload["why"]}

    monkeypatch.setitem(codec.UPCASTERS, "control.tick_requested.v0", v0_to_v1)
    event = codec.decode(b'{"type":"control.tick_requested.v0","event_id":"t","at":1.0,"why":"old"}')
    assert event.reason == "old"  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_subject_tokens_round_trip_and_are_nats_safe(value: str) -> None:
    token = subjects.escape_token(value)
    assert subjects.unescape_token(token) == value
    assert token and all(c.isascii() and (c.isalnum() or c in "-_") for c in token)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash_the_decoder(data: bytes) -> None:
    try:
        codec.decode(data)
    except EventDecodeError:
        pass


def test_deterministic_encoding_sorts_dict_keys() -> None:
    a = codec.encode_value({"b": 1, "a": 2})
    b = codec.encode_value({"a": 2, "b": 1})
    assert a == b == b'{"a":2,"b":1}'
    assert msgspec.json.decode(a) == {"a": 2, "b": 1}
