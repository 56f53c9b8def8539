"""The grid_store_* metric families: the event log store's disk pressure, as the embedded
server's supervisor last measured it (grid.transport.store_pressure), read at scrape time."""

from __future__ import annotations

from collections.abc import Callable

from grid.metrics import CounterSource, GaugeSource, Sample
from grid.transport.store_pressure import STORE_STATES, StorePressure


def store_sources(store: Callable[[], StorePressure | None]) -> list[GaugeSource | CounterSource]:
    """The grid_store_* families, read from the supervisor's last reading at scrape time."""

    def value(read: Callable[[StorePressure], int | None]) -> Callable[[], list[Sample]]:
        def samples() -> list[Sample]:
            pressure = store()
            got = None if pressure is None else read(pressure)
            return [] if got is None else [((), float(got))]

        return samples

    def state() -> list[Sample]:
        pressure = store()
        if pressure is None:
            return []
        return [((s,), 1.0 if s == pressure.state else 0.0) for s in STORE_STATES]

    return [
        GaugeSource("grid_store_free_bytes", "Free bytes on the filesystem holding the event log store.", (),
                    value(lambda p: p.free_bytes)),
        GaugeSource("grid_store_warn_free_bytes", "Free space below which the store reports low_free_space.", (),
                    value(lambda p: p.warn_free_bytes)),
        GaugeSource("grid_store_jetstream_storage_bytes", "Bytes JetStream stores for the log's streams.", (),
                    value(lambda p: p.jetstream_storage_bytes)),
        GaugeSource("grid_store_jetstream_reserved_bytes", "Bytes the log's streams reserve (their size limits).",
                    (), value(lambda p: p.jetstream_reserved_bytes)),
        GaugeSource("grid_store_jetstream_max_bytes", "The file store size JetStream took at start.", (),
                    value(lambda p: p.jetstream_max_bytes)),
        GaugeSource("grid_store_state", "1 for the store's current state (ok, low_free_space, write_failed, "
                                        "unknown), 0 for the others.", ("state",), state),
        CounterSource("grid_store_recoveries", "Restarts of the embedded server that brought a failed store back.",
                      (), value(lambda p: p.recoveries)),
    ]
