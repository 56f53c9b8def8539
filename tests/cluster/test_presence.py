"""presence_view: the lease decides who is active; silent controllers show as unresponsive."""

from __future__ import annotations

from grid.controller.presence import (
    ACTIVE,
    ANNOUNCE_ACTIVE,
    ANNOUNCE_STANDBY,
    ANNOUNCE_STOPPED,
    STANDBY,
    STOPPED,
    UNRESPONSIVE,
    PresenceRecord,
    presence_key,
    presence_view,
)


def rec(cid: str, state: str, term: int = 1) -> PresenceRecord:
    return PresenceRecord(controller_id=cid, state=state, term=term, interval_seconds=1.0)


def test_the_lease_holder_is_active_and_silent_or_stopped_ones_say_so() -> None:
    now = 1000.0
    records = [
        (rec("b", ANNOUNCE_STANDBY), now - 0.5),
        (rec("a", ANNOUNCE_ACTIVE, 3), now - 10.0),  # believed itself active, silent for 10 intervals
        (rec("c", ANNOUNCE_ACTIVE, 4), now - 0.2),  # took over; its record says so, the lease agrees
        (rec("d", ANNOUNCE_STOPPED), now - 0.1),
    ]
    rows = presence_view(records, now=now, holder_id="c", holder_term=4)
    assert [(r["controller_id"], r["state"], r["term"]) for r in rows] == [
        ("c", ACTIVE, 4), ("b", STANDBY, 1), ("a", UNRESPONSIVE, 3), ("d", STOPPED, 1)]
    # A record claiming "active" is not believed without the lease.
    rows = presence_view([(rec("a", ANNOUNCE_ACTIVE, 3), now)], now=now, holder_id="c", holder_term=4)
    assert rows[0]["state"] == STANDBY


def test_presence_keys_are_kv_safe() -> None:
    assert presence_key("a4b595b1") == "presence.a4b595b1"
    odd = presence_key("ctl a/b.c*")
    assert odd.startswith("presence.") and all(ch.isalnum() for ch in odd.removeprefix("presence."))
