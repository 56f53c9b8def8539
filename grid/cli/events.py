"""gridctl events tail | export: read the log as NDJSON or a table."""

from __future__ import annotations

import datetime as dt
import sys
from typing import Optional

import typer
from rich.table import Table

from grid.cli.common import JsonOption, NatsOption, connect, console, fail, run
from grid.events import codec
from grid.events.subjects import ALL_STREAMS

events_app = typer.Typer(help="Read the event log.", no_args_is_help=True)


def parse_when(value: str | None) -> float | None:
    """ISO-8601 time, or a relative '-15m' / '-2h' / '-1d', or epoch seconds."""
    if value is None:
        return None
    value = value.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if value.startswith("-") and value[-1:] in units:
        try:
            return dt.datetime.now(dt.timezone.utc).timestamp() - float(value[1:-1]) * units[value[-1]]
        except ValueError:
            pass
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        fail(f"cannot read time {value!r}: use ISO-8601 (2026-11-29T10:00), epoch seconds, or -15m/-2h/-1d")
        raise
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return parsed.timestamp()


def _streams(stream: str | None) -> tuple[str, ...]:
    if stream is None:
        return ALL_STREAMS
    name = stream.upper() if stream.upper().startswith("GRID_") else f"GRID_{stream.upper()}"
    if name not in ALL_STREAMS:
        fail(f"unknown stream {stream!r}; one of: {', '.join(ALL_STREAMS)}")
    return (name,)


def _ndjson_line(stream: str, seq: int, subject: str, time: float, data: bytes,
                 headers: dict[str, str] | None = None, account: str | None = None) -> bytes:
    """One stored message as an export line. `headers` (the producer's signature among them) and
    `account` (the exporting grid's account key) let a replay verify authorship as the live folds
    do; lines without them are what older exports and grids without identities write."""
    tag = codec.peek_tag(data)
    # The payload is embedded verbatim when it is JSON, so an export round-trips byte for byte.
    try:
        codec.decode(data)
        payload = data
        valid = b"true"
    except codec.EventDecodeError:
        payload = codec.encode_value(data.decode("utf-8", errors="replace"))
        valid = b"false"
    head = codec.encode_value({"stream": stream, "seq": seq, "subject": subject, "time": time, "type": tag})
    extra = b""
    if headers:
        extra += b',"headers":' + codec.encode_value(dict(sorted(headers.items())))
    if account:
        extra += b',"account":' + codec.encode_value(account)
    return head[:-1] + b',"valid":' + valid + extra + b',"event":' + payload + b"}\n"


def _account(log: object) -> str | None:
    """The account key the log's identity verifies against (None without identities)."""
    verifier = getattr(getattr(log, "authorship", None), "verifier", None)
    return getattr(verifier, "account", None)


@events_app.command("export")
def export(
    start: Optional[str] = typer.Option(None, "--from", help="Start time (ISO-8601, epoch or -2h)."),
    end: Optional[str] = typer.Option(None, "--to", help="End time (ISO-8601, epoch or -5m)."),
    stream: Optional[str] = typer.Option(None, "--stream", help="Only this stream (hosts, reqs, ctl, plans, cmds)."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write NDJSON here instead of stdout."),
    nats: Optional[str] = NatsOption,
) -> None:
    """Export a window of events as NDJSON (one stored message per line, with its signature headers)."""
    t0, t1 = parse_when(start), parse_when(end)

    async def go() -> int:
        log = await connect(nats)
        out = open(output, "wb") if output else sys.stdout.buffer
        count = 0
        account = _account(log)
        try:
            for name in _streams(stream):
                async for msg in log.replay(name, start_time=t0, end_time=t1):
                    out.write(_ndjson_line(msg.stream, msg.seq, msg.subject, msg.time, msg.data, msg.headers,
                                           account))
                    count += 1
        finally:
            if output:
                out.close()
            await log.close()
        return count

    count = run(go)
    if output:
        console.print(f"exported {count} events to {output}", style="dim")


@events_app.command("tail")
def tail(
    stream: Optional[str] = typer.Option(None, "--stream", help="Only this stream."),
    last: int = typer.Option(20, "--last", "-n", help="Show this many recent events per stream first."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events."),
    json_out: bool = JsonOption,
    nats: Optional[str] = NatsOption,
) -> None:
    """Show the most recent events (and follow new ones with -f)."""

    def show(msg) -> None:  # type: ignore[no-untyped-def]
        if json_out:
            sys.stdout.buffer.write(_ndjson_line(msg.stream, msg.seq, msg.subject, msg.time, msg.data))
            sys.stdout.flush()
            return
        table = Table(show_header=False, box=None, pad_edge=False)
        when = dt.datetime.fromtimestamp(msg.time, dt.timezone.utc).strftime("%H:%M:%S.%f")[:-3]
        table.add_row(when, msg.stream, str(msg.seq), codec.peek_tag(msg.data) or "<malformed>", msg.subject)
        console.print(table)

    async def go() -> None:
        log = await connect(nats)
        try:
            names = _streams(stream)
            for name in names:
                last_seq = await log.last_sequence(name)
                async for msg in log.replay(name, start_seq=max(1, last_seq - last + 1)):
                    show(msg)
            if follow:
                import asyncio

                subs = [await log.subscribe(n) for n in names]

                async def pump(sub) -> None:  # type: ignore[no-untyped-def]
                    async for msg in sub:
                        show(msg)

                await asyncio.gather(*(pump(s) for s in subs))
        finally:
            await log.close()

    try:
        run(go)
    except KeyboardInterrupt:
        pass
