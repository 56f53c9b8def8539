"""Identity and authorization on the log, with NATS's own model (operator -> account -> users).

- `permissions`: the one table of what each identity may publish and subscribe to; the server
  enforces it through each user JWT, and the README's security table is rendered from it.
- `jwt`, `creds`: NATS JWT claims signed with nkeys; `.creds` files and the nats-py options
  (credentials, per-identity inbox prefix, TLS trust) a process connects with.
- `authority`: the operator, SYS and GRID accounts' keys (owner-only files), user issuing,
  revocation, and the nats-server configuration (the full account resolver).
- `invitations`, `enrolment`: single-use hashed invitations, join tokens, and the join/renew
  exchange the controller serves over NATS request/reply.
- `tls`: a private CA, the server certificate, and the fingerprint a join token pins.
- `provision`, `provenance`, `server`: the host's command consumer (made by the controller),
  the subject-vs-payload check a fold applies, and the embedded server in operator mode.
"""
