"""Inference over NATS: the gateway reaches any enrolled host's engine through its agent.

Engines listen on loopback only and hold a key that never leaves their host. The gateway
publishes a request on `grid.infer.<host>.req` (core NATS, in no stream, so prompts are never
persisted); the host's agent forwards it to its local engine with the engine key and streams
the answer back to the request's reply inbox. A laptop behind NAT serves this way: it only
ever dials out to NATS.

- `wire`: headers and framing shared by both ends.
- `responder`: the agent side.
- `client`: the gateway side, an `UpstreamClient` like the HTTP pools.
- `local`: responders in the requester's own process (`gridctl up`), reached without the broker.
- `direct`: subscriptions whose messages are taken as the NATS client parses them.
"""
