"""A bounded, fragmentation-safe SSE parser that extracts only a final usage token count.

Bytes are passed through to the client untouched elsewhere; this parser sees a copy of each
chunk, reassembles lines across arbitrary chunk boundaries, and for events whose data mentions
"usage" decodes just `usage.completion_tokens`. Malformed or oversized events are ignored.
Nothing else of the stream (no content) is retained.
"""

from __future__ import annotations

import msgspec

MAX_EVENT_BYTES = 64 * 1024


class _Usage(msgspec.Struct):
    completion_tokens: int | None = None


class _UsageChunk(msgspec.Struct):
    usage: _Usage | None = None


_usage_decoder = msgspec.json.Decoder(_UsageChunk)


def completion_tokens_of(data: bytes) -> int | None:
    """`usage.completion_tokens` of one JSON document, or None (malformed, absent, negative)."""
    try:
        chunk = _usage_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    if chunk.usage is None or chunk.usage.completion_tokens is None:
        return None
    tokens = chunk.usage.completion_tokens
    return tokens if 0 <= tokens < 1 << 31 else None


class UsageParser:
    __slots__ = (
        "_data",
        "_data_len",
        "_oversized",
        "_partial",
        "_skipping",
        "completion_tokens",
        "done",
        "events",
    )

    def __init__(self) -> None:
        self._partial = b""
        self._skipping = False  # inside an over-long line: drop bytes until the next newline
        self._data: list[bytes] = []
        self._data_len = 0
        self._oversized = False
        self.completion_tokens: int | None = None
        self.events = 0
        self.done = False  # saw `data: [DONE]`

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        start = 0
        n = len(chunk)
        while start < n:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                rest = chunk[start:]
                if self._skipping:
                    return
                if len(self._partial) + len(rest) > MAX_EVENT_BYTES:
                    self._partial = b""
                    self._skipping = True
                    self._oversized = True
                else:
                    self._partial += rest
                return
            piece = chunk[start:nl]
            start = nl + 1
            if self._skipping:
                self._skipping = False
                continue
            if self._partial:
                line = self._partial + piece
                self._partial = b""
            else:
                line = piece
            if line.endswith(b"\r"):
                line = line[:-1]
            self._line(line)

    def _line(self, line: bytes) -> None:
        if not line:
            self._dispatch()
            return
        if line.startswith(b"data:"):
            value = line[5:]
            if value.startswith(b" "):
                value = value[1:]
            self._data_len += len(value) + 1
            if self._data_len > MAX_EVENT_BYTES:
                self._oversized = True
                self._data = []
            elif not self._oversized:
                self._data.append(value)
        # comments (":"), event:, id:, retry: carry nothing we need

    def _dispatch(self) -> None:
        data, oversized = self._data, self._oversized
        self._data, self._data_len, self._oversized = [], 0, False
        if oversized or not data:
            return
        self.events += 1
        payload = data[0] if len(data) == 1 else b"\n".join(data)
        if payload == b"[DONE]":
            self.done = True
            return
        if b'"usage"' not in payload:
            return
        tokens = completion_tokens_of(payload)
        if tokens is not None:
            self.completion_tokens = tokens

    def close(self) -> None:
        """End of stream: a final event without its blank line still counts."""
        if self._partial and not self._skipping:
            line, self._partial = self._partial, b""
            self._line(line.rstrip(b"\r"))
        self._dispatch()
