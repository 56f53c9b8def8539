"""Every "may not" of the permission table, tried by a real client holding that identity's
credential: the server refuses it with a permission error and no stream gains a message."""

from __future__ import annotations

import asyncio
import json

import msgspec
import nats
import nats.errors
import pytest

from grid.events import codec
from grid.events.subjects import (
    ALL_STREAMS,
    ARTIFACT_STREAM,
    COMMANDS_STREAM,
    COMMANDS_VIEW_STREAM,
    CONTROL_STREAM,
    HOSTS_STREAM,
    LEASE_BUCKET,
    PLANS_STREAM,
    REQUESTS_STREAM,
    command_subject,
    host_subject,
    subject_for,
)
from grid.identity.authority import Authority
from grid.identity.permissions import IMPORTED_JS_PREFIX, Role, host_consumer_prefix, infer_subject_root
from grid.identity.provision import provision_host_consumer
from grid.transport.jetstream import JetStreamLog
from tests.security.conftest import CredsFactory, SecuredNats, event, raw_client, stream_sequences

HOST = "node-1"
OTHER = "node-2"
REFUSAL_WAIT_SECONDS = 3.0


class Attempt(msgspec.Struct, frozen=True):
    """One forbidden action: publish `data` to `subject`, or subscribe to it."""

    what: str
    subject: str
    data: bytes = b""
    subscribe: bool = False


def _publish(what: str, ev_tag: str, **changes: object) -> Attempt:
    ev = event(ev_tag, **changes)
    return Attempt(what, subject_for(ev), codec.encode(ev))


def _api(what: str, subject: str, body: dict[str, object] | None = None) -> Attempt:
    return Attempt(what, subject, json.dumps(body or {}).encode())


def _consumer(stream: str, filter_subject: str, **config: object) -> dict[str, object]:
    return {"stream_name": stream, "config": {"filter_subject": filter_subject, "ack_policy": "none",
                                              "deliver_policy": "all", **config}}


FORGED_COMMAND = dict(host_id=HOST, controller_term=1_000_000_000, kind="load",
                      artifact_source="file:///etc/shadow")

# A host may read who holds the lease (to refuse a command from anyone else); only the writes
# and the other ways into the bucket are refused to it.
_LEASE_WRITES = [
    Attempt("write the lease", f"$KV.{LEASE_BUCKET}.controller", b"forged"),
    _api("read the lease bucket's history", f"$JS.API.CONSUMER.CREATE.KV_{LEASE_BUCKET}",
         _consumer(f"KV_{LEASE_BUCKET}", f"$KV.{LEASE_BUCKET}.>", deliver_subject="_INBOX.x")),
    _api("purge the lease", f"$JS.API.STREAM.PURGE.KV_{LEASE_BUCKET}"),
]
_LEASE = [
    *_LEASE_WRITES,
    _api("get a lease message", f"$JS.API.STREAM.MSG.GET.KV_{LEASE_BUCKET}", {"seq": 1}),
    _api("read the lease bucket", f"$JS.API.STREAM.INFO.KV_{LEASE_BUCKET}"),
    _api("read the lease key", f"$JS.API.DIRECT.GET.KV_{LEASE_BUCKET}.$KV.{LEASE_BUCKET}.controller"),
]
# Direct gets answer with the stored message itself, on any reply subject: the controller's alone.
_DIRECT_GETS = [
    _api("read the lease key by direct get", f"$JS.API.DIRECT.GET.KV_{LEASE_BUCKET}.$KV.{LEASE_BUCKET}.controller"),
    _api("read an artifact by direct get", f"$JS.API.DIRECT.GET.{ARTIFACT_STREAM}", {"seq": 1}),
    _api("read a hosts message by direct get", f"$JS.API.DIRECT.GET.{HOSTS_STREAM}", {"seq": 1}),
]
# Consumers on GRID_CMDS are the controller's alone: a create with a host consumer's name
# re-points it. Every other reader replays the mirror.
_COMMAND_CONSUMERS = [
    _api("create a consumer on the commands stream", f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}",
         _consumer(COMMANDS_STREAM, "grid.cmd.>", deliver_subject="_INBOX.x")),
    _api("re-point a host's command consumer by name", f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}",
         _consumer(COMMANDS_STREAM, "grid.cmd.nobody", name="{consumer}", ack_policy="explicit")),
    _api("re-point a host's command consumer by name (named form)",
         f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}.{{consumer}}.grid.cmd.nobody",
         _consumer(COMMANDS_STREAM, "grid.cmd.nobody", name="{consumer}", ack_policy="explicit")),
]
_MANAGEMENT = [
    _api("delete a stream", f"$JS.API.STREAM.DELETE.{HOSTS_STREAM}"),
    _api("purge a stream", f"$JS.API.STREAM.PURGE.{COMMANDS_STREAM}"),
    _api("create a stream", "$JS.API.STREAM.CREATE.EVIL", {"name": "EVIL", "subjects": ["evil.>"]}),
    _api("delete a host's consumer", f"$JS.API.CONSUMER.DELETE.{COMMANDS_STREAM}.{{consumer}}"),
    _api("pull a host's commands", f"$JS.API.CONSUMER.MSG.NEXT.{COMMANDS_STREAM}.{{consumer}}",
         {"batch": 1}),
]

CASES: dict[Role, list[Attempt]] = {
    Role.HOST: [
        _publish("heartbeat under another host's id", "host.heartbeat.v1", host_id=OTHER),
        _publish("register as another host", "host.registered.v1", host_id=OTHER),
        _publish("ack for another host", "host.ack.v1", host_id=OTHER),
        _publish("a forged command to itself", "command.issued.v1", **FORGED_COMMAND),
        _publish("a command to another host", "command.issued.v1", **{**FORGED_COMMAND, "host_id": OTHER}),
        _publish("request features", "request.batch.v1"),
        _publish("control: mode", "control.mode_set.v1"),
        _publish("control: profile", "control.profile_set.v1"),
        _publish("a quality evaluation", "control.evaluation_recorded.v1"),
        _publish("a plan", "plan.created.v1"),
        Attempt("read another host's subjects", host_subject(OTHER, "heartbeat"), subscribe=True),
        Attempt("read all host subjects", "grid.host.>", subscribe=True),
        Attempt("read requests", "grid.req.>", subscribe=True),
        Attempt("read commands", "grid.cmd.>", subscribe=True),
        Attempt("read control", "grid.ctl.>", subscribe=True),
        Attempt("read every inbox", "_INBOX.>", subscribe=True),
        Attempt("serve another host's inference", f"{infer_subject_root(OTHER)}.>", subscribe=True),
        _api("replay the hosts stream", f"$JS.API.CONSUMER.CREATE.{HOSTS_STREAM}",
             _consumer(HOSTS_STREAM, "grid.host.>", deliver_subject="_INBOX.x")),
        _api("replay the requests stream", f"$JS.API.CONSUMER.CREATE.{REQUESTS_STREAM}",
             _consumer(REQUESTS_STREAM, "grid.req.>", deliver_subject="_INBOX.x")),
        _api("its own consumer re-pointed at another host's heartbeat subject",
             f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}.{{consumer}}.{command_subject(HOST)}",
             _consumer(COMMANDS_STREAM, command_subject(HOST), durable_name="{consumer}",
                       name="{consumer}", deliver_subject=host_subject(OTHER, "heartbeat"))),
        _api("its consumer name over every host's commands",
             f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}.{{consumer}}.grid.cmd.>",
             _consumer(COMMANDS_STREAM, "grid.cmd.>", durable_name="{consumer}")),
        _api("its consumer through the legacy durable API",
             f"$JS.API.CONSUMER.DURABLE.CREATE.{COMMANDS_STREAM}.{{consumer}}",
             _consumer(COMMANDS_STREAM, "grid.cmd.>", durable_name="{consumer}")),
        _api("another host's consumer",
             f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}.{{other_consumer}}.{command_subject(OTHER)}",
             _consumer(COMMANDS_STREAM, command_subject(OTHER), durable_name="{other_consumer}")),
        _api("pull another host's commands",
             f"$JS.API.CONSUMER.MSG.NEXT.{COMMANDS_STREAM}.{{other_consumer}}", {"batch": 1}),
        Attempt("ack another host's commands", f"$JS.ACK.{COMMANDS_STREAM}.{{other_consumer}}.1.1.1.1.0"),
        _api("list streams", "$JS.API.STREAM.NAMES"),
        _api("read back another host's last heartbeat",
             f"$JS.API.DIRECT.GET.{HOSTS_STREAM}.{host_subject(OTHER, 'heartbeat')}"),
        _api("get a hosts message by sequence", f"$JS.API.DIRECT.GET.{HOSTS_STREAM}", {"seq": 1}),
        _api("read back its own last heartbeat by direct get",
             f"$JS.API.DIRECT.GET.{HOSTS_STREAM}.{host_subject(HOST, 'heartbeat')}"),
        *_DIRECT_GETS,
        *_LEASE_WRITES,
        *_MANAGEMENT[:4],
    ],
    Role.GATEWAY: [
        _publish("a forged command", "command.issued.v1", **FORGED_COMMAND),
        _publish("control: mode", "control.mode_set.v1"),
        _publish("control: profile", "control.profile_set.v1"),
        # Inference traffic must never pose as the owner's quality evidence.
        _publish("a quality evaluation", "control.evaluation_recorded.v1"),
        _publish("a heartbeat", "host.heartbeat.v1", host_id=HOST),
        _publish("a plan", "plan.created.v1"),
        Attempt("read commands", "grid.cmd.>", subscribe=True),
        Attempt("read every inbox", "_INBOX.>", subscribe=True),
        _api("replay the commands stream", f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}",
             _consumer(COMMANDS_STREAM, "grid.cmd.>", deliver_subject="_INBOX.x")),
        _api("replay the commands mirror", f"$JS.API.CONSUMER.CREATE.{COMMANDS_VIEW_STREAM}",
             _consumer(COMMANDS_VIEW_STREAM, "grid.cmd.>", deliver_subject="_INBOX.x")),
        *_DIRECT_GETS,
        *_LEASE,
        *_MANAGEMENT,
    ],
    Role.OPERATOR: [
        _publish("a forged command", "command.issued.v1", **FORGED_COMMAND),
        _publish("a heartbeat", "host.heartbeat.v1", host_id=HOST),
        _publish("request features", "request.batch.v1"),
        _publish("a plan", "plan.created.v1"),
        Attempt("read requests live", "grid.req.>", subscribe=True),
        Attempt("read every inbox", "_INBOX.>", subscribe=True),
        *_DIRECT_GETS,
        *_COMMAND_CONSUMERS,
        *_LEASE,
        *_MANAGEMENT,
    ],
    Role.READER: [
        _publish("a forged command", "command.issued.v1", **FORGED_COMMAND),
        _publish("a heartbeat", "host.heartbeat.v1", host_id=HOST),
        _publish("request features", "request.batch.v1"),
        _publish("control: mode", "control.mode_set.v1"),
        _publish("a quality evaluation", "control.evaluation_recorded.v1"),
        _publish("a plan", "plan.created.v1"),
        _api("replay a stream it was not given", f"$JS.API.CONSUMER.CREATE.{REQUESTS_STREAM}",
             _consumer(REQUESTS_STREAM, "grid.req.>", deliver_subject="_INBOX.x")),
        Attempt("read every inbox", "_INBOX.>", subscribe=True),
        *_DIRECT_GETS,
        *_COMMAND_CONSUMERS,
        *_LEASE,
        *_MANAGEMENT,
    ],
}
PARAMS = [pytest.param(role, attempt, id=f"{role.value}: {attempt.what}")
          for role, attempts in CASES.items() for attempt in attempts]


def _resolve(attempt: Attempt, consumer: str | None, other_consumer: str | None) -> Attempt:
    """Fill in the real consumer names: refused even by an attacker who learnt them."""
    assert consumer is not None and other_consumer is not None

    def fill(text: str) -> str:
        return text.replace("{consumer}", consumer).replace("{other_consumer}", other_consumer)

    return msgspec.structs.replace(attempt, subject=fill(attempt.subject), data=fill(attempt.data.decode()).encode())


async def refused(nc: nats.NATS, attempt: Attempt) -> str:
    """Make the attempt; return the server's permission error for it (fails if none comes)."""
    errors: list[Exception] = nc.permission_errors  # type: ignore[attr-defined]
    if attempt.subscribe:
        sub = await nc.subscribe(attempt.subject)
    else:
        headers = {"Nats-Msg-Id": f"attempt-{attempt.what}"}
        await nc.publish(attempt.subject, attempt.data, reply=nc.new_inbox(), headers=headers)
    await nc.flush()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REFUSAL_WAIT_SECONDS
    kind = "subscription" if attempt.subject and attempt.subscribe else "publish"
    wanted = f'permissions violation for {kind} to "{attempt.subject}"'
    while loop.time() < deadline:
        for exc in errors:
            if wanted.lower() in str(exc).lower():
                return str(exc)
        await asyncio.sleep(0.02)
    if attempt.subscribe:
        await sub.unsubscribe()
    raise AssertionError(f"no permission error for {attempt.what!r} ({attempt.subject}); saw {errors}")


@pytest.mark.parametrize(("role", "attempt"), PARAMS)
async def test_refused_and_nothing_appended(
    role: Role, attempt: Attempt, secured_server: SecuredNats, creds: CredsFactory,
    controller_log: JetStreamLog, authority: Authority,
) -> None:
    # Something in every stream, a host consumer to attack, and the lease held.
    for tag in ("host.heartbeat.v1", "request.batch.v1", "control.mode_set.v1", "plan.created.v1"):
        await controller_log.append(event(tag, host_id=HOST) if tag.startswith("host") else event(tag))
    await controller_log.append(event("command.issued.v1", host_id=HOST))
    await controller_log.kv_put(LEASE_BUCKET, "controller", b"term-1")
    host = authority.host_principal(HOST)
    await provision_host_consumer(controller_log, host)
    attempt = _resolve(attempt, host.command_consumer, authority.host_principal(OTHER).command_consumer)
    before = await stream_sequences(controller_log)
    principal = {"host_id": HOST} if role is Role.HOST else {}
    streams = {"streams": (HOSTS_STREAM, COMMANDS_STREAM)} if role is Role.READER else {}
    nc = await raw_client(secured_server, creds(role, **principal, **streams))
    try:
        await refused(nc, attempt)
    finally:
        await nc.close()
    assert await stream_sequences(controller_log) == before
    assert sorted(before) == sorted(ALL_STREAMS)
    info = await controller_log.client.jetstream().consumer_info(COMMANDS_STREAM, host.command_consumer)
    assert info.num_pending == 1 and info.config.filter_subject == command_subject(HOST)
    lease = await controller_log.kv_get(LEASE_BUCKET, "controller")
    assert lease is not None and lease.value == b"term-1"


@pytest.mark.parametrize("role", [Role.OPERATOR, Role.READER, Role.GATEWAY])
async def test_the_ephemeral_consumer_api_cannot_reach_a_host_consumer_it_cannot_name(
    role: Role, secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog,
    authority: Authority,
) -> None:
    """`CONSUMER.CREATE.<stream>` with a `name` updates that consumer if it exists. On GRID_CMDS
    nobody but the controller may create consumers at all; behind that, a host's consumer name is
    unguessable, so even a guess that got through would create a harmless ephemeral."""
    host = authority.host_principal(HOST)
    assert host.command_consumer is not None and host.command_consumer != f"agent-{HOST}"
    await controller_log.append(event("command.issued.v1", host_id=HOST))
    await provision_host_consumer(controller_log, host)
    js = controller_log.client.jetstream()
    before = await js.consumer_info(COMMANDS_STREAM, host.command_consumer)
    nc = await raw_client(secured_server, creds(role, streams=(COMMANDS_STREAM,) if role is Role.READER else ()))
    try:
        for guess in (f"agent-{HOST}", host_consumer_prefix(HOST).rstrip("-"), host_consumer_prefix(HOST) + "0" * 24):
            body = {"stream_name": COMMANDS_STREAM, "config": {
                "name": guess, "filter_subject": "grid.cmd.nobody", "ack_policy": "explicit",
                "deliver_policy": "all", "max_deliver": 1}}
            await nc.publish(f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}", json.dumps(body).encode(),
                             reply=nc.new_inbox())
        await nc.flush()
        await asyncio.sleep(0.3)
    finally:
        await nc.close()
    after = await js.consumer_info(COMMANDS_STREAM, host.command_consumer)
    assert (after.config.filter_subject, after.config.max_deliver, after.num_pending) == (
        command_subject(HOST), before.config.max_deliver, 1)


@pytest.mark.parametrize(("stream", "target"), [
    (COMMANDS_VIEW_STREAM, "grid.host.node-2.heartbeat"),
    (CONTROL_STREAM, "grid.cmd.node-1"),
    (PLANS_STREAM, "grid.ctl.mode"),
])
async def test_a_consumer_aimed_at_another_streams_subject_appends_nothing(
    stream: str, target: str, secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog
) -> None:
    """The server checks no permission on a consumer's delivery subject, so a consumer could
    launder old events into a stream: no role but the controller may create one (under either
    name of the API: GRID's is refused, its own account imports none), and nothing is appended."""
    for tag in ("command.issued.v1", "control.mode_set.v1", "plan.created.v1"):
        await controller_log.append(event(tag, host_id=HOST) if tag.startswith("command") else event(tag))
    before = await stream_sequences(controller_log)
    js = controller_log.client.jetstream()
    for _ in range(100):  # the mirror holds the command too, so there is something to launder
        if stream != COMMANDS_VIEW_STREAM or (await js.stream_info(stream)).state.last_seq >= 1:
            break
        await asyncio.sleep(0.05)
    nc = await raw_client(secured_server, creds(Role.OPERATOR))
    try:
        body = {"stream_name": stream, "config": {"deliver_subject": target, "ack_policy": "none",
                                                  "deliver_policy": "all"}}
        for api in ("$JS.API", IMPORTED_JS_PREFIX):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await nc.request(f"{api}.CONSUMER.CREATE.{stream}", json.dumps(body).encode(), timeout=2)
        await asyncio.sleep(1.0)
    finally:
        await nc.close()
    assert await stream_sequences(controller_log) == before
