"""The v1 event catalogue, its codec, subject naming and the event log protocol.

Pure: nothing here opens a connection or starts a process. The JetStream implementation of the
log, the embedded server and the object store are in grid.transport.
"""
