"""The v1 event catalogue, its codec, subject naming and the event log."""
