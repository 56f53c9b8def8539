"""SharedMap against a plain dict: the same reads after any sequence of sets, in sorted key order,
with every earlier version still reading as it did (what lets a tick hold a state by reference)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.events.codec import builtin_value, encode_value
from grid.projections.sharedmap import SharedMap, _bucket_of

# Few enough distinct keys that sets often overwrite, many enough to share buckets now and then.
KEYS = st.one_of(st.sampled_from([f"host-{i:04d}" for i in range(40)]), st.text(max_size=8))
OPS = st.lists(st.tuples(KEYS, st.integers(-(2**31), 2**31)), max_size=120)


def reads_as(m: SharedMap[int], model: dict[str, int]) -> None:
    assert len(m) == len(model)
    assert list(m) == sorted(model)
    assert list(m.keys()) == sorted(model)
    assert list(m.items()) == sorted(model.items())
    assert list(m.values()) == [model[k] for k in sorted(model)]
    assert dict(m) == model and m == model and m == SharedMap(model)
    for key, value in model.items():
        assert key in m and m[key] == value and m.get(key) == value
        assert (key, value) in m.items()


@settings(max_examples=300, deadline=None)
@given(ops=OPS, absent=st.text(max_size=8))
def test_a_map_reads_as_the_dict_of_its_sets_and_earlier_versions_do_not_move(ops: list[tuple[str, int]],
                                                                              absent: str) -> None:
    versions: list[tuple[SharedMap[int], dict[str, int]]] = [(SharedMap(), {})]
    for key, value in ops:
        m, model = versions[-1]
        versions.append((m.set(key, value), {**model, key: value}))
    for m, model in versions:
        reads_as(m, model)
        if absent not in model:
            assert absent not in m and m.get(absent) is None and m.get(absent, 7) == 7
            with pytest.raises(KeyError):
                m[absent]


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(KEYS, st.one_of(st.none(), st.integers(-(2**31), 2**31))), max_size=120))
def test_removals_read_as_the_dict_of_its_sets_and_removals_and_earlier_versions_do_not_move(
        ops: list[tuple[str, int | None]]) -> None:
    versions: list[tuple[SharedMap[int], dict[str, int]]] = [(SharedMap(), {})]
    for key, value in ops:
        m, model = versions[-1]
        if value is None:  # a removal (of a key that may not be there: then the map is itself)
            removed = m.without(key)
            assert (removed is m) == (key not in model)
            versions.append((removed, {k: v for k, v in model.items() if k != key}))
        else:
            versions.append((m.set(key, value), {**model, key: value}))
    for m, model in versions:
        reads_as(m, model)
        assert encode_value(m) == encode_value(model)


@settings(max_examples=200, deadline=None)
@given(ops=OPS)
def test_the_order_of_sets_is_not_visible(ops: list[tuple[str, int]]) -> None:
    model = dict(ops)
    forward = SharedMap[int]()
    for key, value in ops:
        forward = forward.set(key, value)
    backward = SharedMap[int]()
    for key in reversed(list(model)):
        backward = backward.set(key, model[key])
    assert forward == backward == SharedMap(model) == SharedMap(list(model.items()))
    assert list(forward.items()) == list(backward.items())
    # Encoded as the dict it reads as: the bytes a plain dict of the same entries gives.
    assert encode_value(forward) == encode_value(model) == encode_value(backward)
    copied = msgspec.msgpack.decode(msgspec.msgpack.encode(forward, enc_hook=builtin_value))
    assert list(copied.items()) == sorted(model.items())


def test_keys_in_one_bucket_stay_apart() -> None:
    first: dict[int, str] = {}
    pair = None
    for i in range(5000):
        key = f"host-{i}"
        other = first.setdefault(_bucket_of(key), key)
        if other != key:
            pair = (other, key)
            break
    assert pair is not None
    a, b = pair
    one = SharedMap[int]().set(a, 1)
    two = one.set(b, 2)
    three = two.set(a, 3)
    assert dict(one) == {a: 1} and dict(two) == {a: 1, b: 2} and dict(three) == {a: 3, b: 2}
    assert len(three) == 2


def test_only_string_keys() -> None:
    m = SharedMap({"a": 1})
    assert 1 not in m and m.get(1) is None  # type: ignore[call-overload]
    with pytest.raises(KeyError):
        m[1]  # type: ignore[index]
    with pytest.raises(TypeError):
        SharedMap({1: "a"})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        hash(m)


def test_fleet_and_lifecycle_snapshots_keep_their_bytes_and_come_back_shared() -> None:
    """The per-host maps of the heartbeat folds are SharedMaps: written as the dicts they were,
    restored as SharedMaps that fold on exactly as the live ones do."""
    from grid.controller.tick import PROJECTIONS
    from grid.events.subjects import HOSTS_STREAM
    from grid.projections.position import Position
    from grid.projections.runner import ProjectionRunner
    from tests.heartbeats import heartbeat

    live = ProjectionRunner(PROJECTIONS)
    for seq, host in enumerate(("h-3", "h-1", "h-2", "h-1"), start=1):
        live.fold_event(heartbeat(host, at=1000.0 + seq, event_id=f"hb-{seq}"), Position(HOSTS_STREAM, seq, 1000.0 + seq))
    for name in ("fleet", "lifecycle"):
        hosts = live.states[name].hosts
        assert isinstance(hosts, SharedMap) and list(hosts) == ["h-1", "h-2", "h-3"]
        plain = msgspec.structs.asdict(live.states[name]) | {"hosts": dict(hosts)}
        assert encode_value(live.states[name]) == encode_value(plain)
    restored = ProjectionRunner(PROJECTIONS)
    restored.restore_bytes(live.snapshot_bytes())
    assert restored.snapshot_bytes() == live.snapshot_bytes()
    for runner in (live, restored):
        runner.fold_event(heartbeat("h-0", at=1010.0, event_id="hb-5"), Position(HOSTS_STREAM, 5, 1010.0))
    for name in ("fleet", "lifecycle"):
        assert isinstance(restored.states[name].hosts, SharedMap)
        assert restored.states[name] == live.states[name]
    assert restored.snapshot_bytes() == live.snapshot_bytes()


def test_actions_and_placed_snapshots_keep_their_bytes_and_come_back_shared() -> None:
    """The command and ack folds' maps (actions, timings; placed acks, warms) are SharedMaps:
    written as the dicts they were, restored as SharedMaps that fold on exactly as the live ones."""
    from grid.controller.tick import PROJECTIONS
    from grid.events.acks import ActionAck
    from grid.events.commands import CommandIssued
    from grid.events.subjects import COMMANDS_STREAM, HOSTS_STREAM
    from grid.projections.position import Position
    from grid.projections.runner import ProjectionRunner

    def command(n: int, kind: str, host: str) -> CommandIssued:
        return CommandIssued(event_id=f"c{n}", at=1000.0, action_id=f"a{n}", kind=kind, host_id=host, model_id="m",  # type: ignore[arg-type]
                             memory_mb=100, generation="g", controller_term=1, controller_id="ctl",
                             lease_expires_at=1060.0, lease_ttl_seconds=60.0)

    def ack(n: int, kind: str, host: str, status: str) -> ActionAck:
        return ActionAck(event_id=f"k{n}-{status}", at=1001.0, host_id=host, action_id=f"a{n}", status=status,  # type: ignore[arg-type]
                         kind=kind, model_id="m", duration_seconds=2.0)

    live = ProjectionRunner(PROJECTIONS)
    events = [(COMMANDS_STREAM, command(n, kind, host)) for n, (kind, host) in
              enumerate((("load", "h-2"), ("warm", "h-2"), ("load", "h-1"), ("warm", "h-1")))]
    events += [(HOSTS_STREAM, ack(n, kind, host, status)) for n, (kind, host) in
               enumerate((("load", "h-2"), ("warm", "h-2"), ("load", "h-1"))) for status in ("accepted", "succeeded")]
    for seq, (stream, event) in enumerate(events, start=1):
        live.fold_event(event, Position(stream, seq, 1000.0 + seq))
    maps = {"actions": ("actions", "timings"), "placed": ("acks", "warms")}
    for name, fields in maps.items():
        state = live.states[name]
        plain = msgspec.structs.asdict(state)
        for field in fields:
            assert isinstance(getattr(state, field), SharedMap) and len(getattr(state, field)) > 0
            plain[field] = dict(getattr(state, field))
            # Each map is written as the dict it reads as, byte for byte.
            assert encode_value(getattr(state, field)) == encode_value(plain[field])
        assert msgspec.json.decode(encode_value(state)) == msgspec.json.decode(encode_value(plain))
    restored = ProjectionRunner(PROJECTIONS)
    restored.restore_bytes(live.snapshot_bytes())
    assert restored.snapshot_bytes() == live.snapshot_bytes()
    for runner in (live, restored):
        runner.fold_event(ack(3, "warm", "h-1", "succeeded"), Position(HOSTS_STREAM, 99, 1099.0))
    for name, fields in maps.items():
        assert all(isinstance(getattr(restored.states[name], f), SharedMap) for f in fields)
        assert restored.states[name] == live.states[name]
    assert restored.snapshot_bytes() == live.snapshot_bytes()
