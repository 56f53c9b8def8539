"""How bytes move between Grid's processes, apart from what they mean (grid.events).

* :mod:`grid.transport.jetstream` - the EventLog protocol (grid.events.log) on NATS JetStream,
  with its consumers in :mod:`grid.transport.jetstream_consumers`;
* :mod:`grid.transport.embedded` - the nats-server process `gridctl up` runs, with its store
  budget (:mod:`grid.transport.log_budget`) and disk pressure (:mod:`grid.transport.store_pressure`);
* :mod:`grid.transport.nats_failover` - leaving a silent NATS node quickly on reconnect;
* :mod:`grid.transport.cluster` - a NATS cluster's configuration and nodes;
* :mod:`grid.transport.artifact_store` - the JetStream object store for model artifacts;
* :mod:`grid.transport.h1` - the HTTP/1.1 connection pool the host agent uses to reach its own
  llama.cpp engines (bench.engine_hop measures it against httpx and aiohttp).
"""
