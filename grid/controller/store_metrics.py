"""The grid_store_* metric families: the event log store as status's `store` row shows it (the
local supervisor's disk reading beside `gridctl up`, else the JetStream account's reading on a
cluster: grid.controller.store_view), read at scrape time. One source for both, so a scrape and
`gridctl status` never disagree, and a controller on a cluster exports what it can know instead
of nothing."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from grid.controller.store_view import SOURCE_ACCOUNT, SOURCE_LOCAL, SOURCE_NONE
from grid.metrics import CounterSource, GaugeSource, Sample
from grid.transport.store_pressure import STORE_STATES

STORE_SOURCES = (SOURCE_LOCAL, SOURCE_ACCOUNT, SOURCE_NONE)


def store_sources(store: Callable[[], Mapping[str, Any]]) -> list[GaugeSource | CounterSource]:
    """The grid_store_* families, read from status's store row at scrape time. A field the reading
    cannot know (None: a remote server's disk) is left out rather than exported as 0."""

    def value(field: str) -> Callable[[], list[Sample]]:
        def samples() -> list[Sample]:
            got = store().get(field)
            ok = isinstance(got, (int, float)) and not isinstance(got, bool)
            return [((), float(got))] if ok else []

        return samples

    def one_of(field: str, choices: tuple[str, ...]) -> Callable[[], list[Sample]]:
        def samples() -> list[Sample]:
            current = store().get(field)
            return [((c,), 1.0 if c == current else 0.0) for c in choices]

        return samples

    return [
        GaugeSource("grid_store_free_bytes", "Free bytes on the store's filesystem (beside gridctl up), or left "
                                             "under the JetStream account's storage limit (on a cluster).", (),
                    value("free_bytes")),
        GaugeSource("grid_store_warn_free_bytes", "Free space below which the store reports low_free_space.", (),
                    value("warn_free_bytes")),
        GaugeSource("grid_store_jetstream_storage_bytes", "Bytes JetStream stores for the log's streams.", (),
                    value("jetstream_storage_bytes")),
        GaugeSource("grid_store_jetstream_reserved_bytes", "Bytes the log's streams reserve (their size limits).",
                    (), value("jetstream_reserved_bytes")),
        GaugeSource("grid_store_jetstream_max_bytes", "The file store size JetStream took at start, or the "
                                                      "account's storage limit.", (), value("jetstream_max_bytes")),
        GaugeSource("grid_store_state", "1 for the store's current state (ok, low_free_space, write_failed, "
                                        "unknown), 0 for the others.", ("state",), one_of("state", STORE_STATES)),
        GaugeSource("grid_store_source", "1 for where the store reading comes from (local_server_disk, "
                                         "jetstream_account_info, none), 0 for the others.", ("source",),
                    one_of("source", STORE_SOURCES)),
        CounterSource("grid_store_recoveries", "Restarts of the embedded server that brought a failed store back.",
                      (), value("recoveries")),
    ]
