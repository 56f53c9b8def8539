"""X-Grid-Affinity-Key: validation, hashing, and rendezvous stability."""

from __future__ import annotations

import hashlib

from grid.gateway import affinity
from grid.gateway.affinity import AffinityError, parse_affinity_key, rendezvous_pick, telemetry_hash
from grid.gateway.routing import RouteCandidate, choose

NOW = 1_800_000_000.0


def test_valid_key_is_hashed_at_once() -> None:
    digest = parse_affinity_key(b"session-42")
    assert digest == hashlib.sha256(b"session-42").digest()
    assert parse_affinity_key(None) is None
    # 256 UTF-8 bytes (multi-byte characters included) is the limit
    ok = ("é" * 128).encode()
    assert len(ok) == 256 and isinstance(parse_affinity_key(ok), bytes)


def test_invalid_keys_are_refused_with_a_reason() -> None:
    cases = {
        b"": affinity.REASON_EMPTY,
        b"x" * 257: affinity.REASON_TOO_LONG,
        b"\xff\xfe": affinity.REASON_NOT_UTF8,
        b"a\tb": affinity.REASON_NOT_PRINTABLE,
        "a\u200bb".encode(): affinity.REASON_NOT_PRINTABLE,
    }
    for raw, reason in cases.items():
        result = parse_affinity_key(raw)
        assert isinstance(result, AffinityError) and result.reason == reason, raw
        assert raw.decode("utf-8", "replace") not in result.message or not raw


def test_telemetry_carries_a_second_hash_only() -> None:
    raw = b"user@example.com/session-1"
    digest = parse_affinity_key(raw)
    assert isinstance(digest, bytes)
    t = telemetry_hash(digest)
    assert t == hashlib.sha256(digest).hexdigest()
    assert t != digest.hex() and t != hashlib.sha256(raw).hexdigest() and raw.decode() not in t


def _keys(n: int) -> list[bytes]:
    return [hashlib.sha256(f"k{i}".encode()).digest() for i in range(n)]


def test_rendezvous_adding_a_member_moves_only_keys_it_now_wins() -> None:
    members = [f"engine-{i}" for i in range(5)]
    keys = _keys(3000)
    before = {k: rendezvous_pick(k, members, str) for k in keys}
    after = {k: rendezvous_pick(k, [*members, "engine-new"], str) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == "engine-new" for k in moved)
    assert 0.10 < len(moved) / len(keys) < 0.25  # about 1/6


def test_rendezvous_removing_a_member_moves_only_its_keys() -> None:
    members = [f"engine-{i}" for i in range(6)]
    keys = _keys(3000)
    before = {k: rendezvous_pick(k, members, str) for k in keys}
    after = {k: rendezvous_pick(k, members[:-1], str) for k in keys}
    for k in keys:
        if before[k] != "engine-5":
            assert after[k] == before[k]


def _cand(host: str) -> RouteCandidate:
    ep = f"http://{host}:1"
    return RouteCandidate(key=(host, ep, "m"), host_id=host, model_id="m", endpoint=ep, state="ready",
                     host_state="accepting", heartbeat_at=NOW, max_concurrency=4)


def test_router_affinity_is_stable_when_an_equivalent_engine_joins() -> None:
    engines = [_cand(f"h{i}") for i in range(4)]
    keys = _keys(800)
    before = {k: choose(engines, now=NOW, affinity=k).route.host_id for k in keys}  # type: ignore[union-attr]
    joined = [*engines, _cand("h-new")]
    after = {k: choose(joined, now=NOW, affinity=k).route.host_id for k in keys}  # type: ignore[union-attr]
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(after[k] == "h-new" for k in moved)
    # sessions spread over the engines rather than piling onto one
    assert len(set(before.values())) == 4


def test_without_affinity_equal_engines_get_the_deterministic_best() -> None:
    engines = [_cand(f"h{i}") for i in range(4)]
    assert {choose(engines, now=NOW).route.host_id for _ in range(10)} == {"h0"}  # type: ignore[union-attr]
