"""What the responder sends to an engine: the engine's key only when it has one (an external
engine registered without a key gets no authorization header, not an empty bearer), and only the
request headers the gateway forwards."""

from __future__ import annotations

from grid.infer import wire
from grid.infer.responder import EngineRoute, engine_request_headers


def test_a_keyed_engine_gets_its_bearer_key() -> None:
    headers = engine_request_headers(EngineRoute("http://127.0.0.1:1", "sk-engine"), {})
    assert headers == [(b"authorization", b"Bearer sk-engine")]


def test_an_engine_without_a_key_gets_no_authorization_header() -> None:
    for key in (None, ""):
        headers = engine_request_headers(EngineRoute("http://127.0.0.1:1", key), {wire.H_CONNECTION: "close"})
        assert [name for name, _ in headers] == [wire.H_CONNECTION.lower().encode()]


def test_only_forwarded_headers_pass_and_connection_only_to_close() -> None:
    request = {name: "v" for name in wire.FORWARDED_REQUEST_HEADERS} | {"x-not-forwarded": "secret"}
    request[wire.H_CONNECTION] = "keep-alive"
    names = {name for name, _ in engine_request_headers(EngineRoute("http://127.0.0.1:1", "k"), request)}
    assert b"x-not-forwarded" not in names and wire.H_CONNECTION.lower().encode() not in names
    assert names == {b"authorization"} | {n.lower().encode() for n in wire.FORWARDED_REQUEST_HEADERS
                                          if n != wire.H_CONNECTION}
