"""Replication is a setting: R3 on a cluster of three, R1 on one server, drift fixed or reported."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import nats.errors
import pytest

from grid.config import ConfigError, GridConfig, parse_replicas
from grid.events.log import LogError
from grid.events.subjects import ALL_STREAMS, ARTIFACT_STREAM, COMMANDS_VIEW_STREAM, LEASE_BUCKET
from grid.transport.artifact_store import ensure_artifact_store
from grid.transport.cluster import ClusterNode, NatsCluster
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import (
    REPLICAS_CREATED,
    REPLICAS_MISMATCH,
    REPLICAS_OK,
    REPLICAS_UPDATED,
    JetStreamLog,
)

# The event streams and the commands mirror (Grid's own configuration), then the lease bucket.
GRID_STREAMS = (*ALL_STREAMS, COMMANDS_VIEW_STREAM)
EVERY_STREAM = (*GRID_STREAMS, f"KV_{LEASE_BUCKET}")


async def replica_counts(log: JetStreamLog, settle: float = 15.0) -> dict[str, tuple[int, int]]:
    """stream -> (configured replicas, peers the server reports: leader + followers), once the
    peers match the configuration (new peers join a stream asynchronously) or `settle` passed."""
    js = log.client.jetstream()
    deadline = asyncio.get_running_loop().time() + settle
    while True:
        out = {}
        for name in EVERY_STREAM:
            try:
                info = await js.stream_info(name)
            except nats.errors.TimeoutError:  # no stream leader for a moment while peers move
                out[name] = (0, 0)
                continue
            peers = 1 + len(info.cluster.replicas or []) if info.cluster is not None else 1
            out[name] = (int(info.config.num_replicas or 1), peers)
        if all(c == p for c, p in out.values()) or asyncio.get_running_loop().time() > deadline:
            return out
        await asyncio.sleep(0.2)


async def test_a_three_node_cluster_gets_r3_streams_and_lease_bucket(nats_cluster: NatsCluster) -> None:
    log = await JetStreamLog.connect(nats_cluster.url)
    try:
        assert log.clustered()
        assert await replica_counts(log) == {name: (3, 3) for name in EVERY_STREAM}
        assert {r.stream: r.outcome for r in log.replica_reports}[ALL_STREAMS[0]] == REPLICAS_CREATED
        # The lease works on the replicated bucket.
        assert await log.kv_put(LEASE_BUCKET, "probe", b"x", expected_revision=0) >= 1
    finally:
        await log.close()


async def test_existing_r1_streams_are_updated_to_r3_in_place(nats_cluster: NatsCluster) -> None:
    first = await JetStreamLog.connect(nats_cluster.url, replicas=1)
    try:
        assert await replica_counts(first) == {name: (1, 1) for name in EVERY_STREAM}
        await first.append_raw("grid.ctl.tick", b"{}", msg_id="before-update")
    finally:
        await first.close()
    second = await JetStreamLog.connect(nats_cluster.urls[1])
    try:
        assert {r.stream: r.outcome for r in second.replica_reports} == {n: REPLICAS_UPDATED for n in EVERY_STREAM}
        assert await replica_counts(second) == {name: (3, 3) for name in EVERY_STREAM}
        assert await second.last_sequence("GRID_CTL") == 1  # nothing lost by the update
    finally:
        await second.close()


async def test_the_setting_wins_and_an_automatic_choice_never_shrinks(nats_cluster: NatsCluster) -> None:
    log = await JetStreamLog.connect(nats_cluster.url, replicas=2)
    try:
        assert await replica_counts(log) == {name: (2, 2) for name in EVERY_STREAM}
    finally:
        await log.close()
    grown = await JetStreamLog.connect(nats_cluster.url, replicas=3)
    await grown.close()
    # Automatic (3 here) never shrinks what a stream has, and leaves R3 streams alone.
    auto = await JetStreamLog.connect(nats_cluster.urls[2])
    try:
        assert auto.wanted_replicas(5) == 5
        assert await replica_counts(auto) == {name: (3, 3) for name in EVERY_STREAM}
    finally:
        await auto.close()


class UnadvertisedNode(ClusterNode):
    """A node whose INFO names no other node (`no_advertise`), as a node that has not yet routed
    to its peers shows fewer nodes than the cluster has."""

    def extra_config(self) -> str:
        return super().extra_config().replace("cluster {\n", "cluster {\n  no_advertise: true\n", 1)


async def test_automatic_replicas_follow_placement_not_the_nodes_a_server_advertises(tmp_path: Path) -> None:
    with NatsCluster(tmp_path / "nats", nodes=3, node_factory=UnadvertisedNode) as cluster:
        log = await JetStreamLog.connect(cluster.url)
        try:
            assert log.clustered() and not log.client._server_info.get("connect_urls")
            assert await replica_counts(log) == {name: (3, 3) for name in EVERY_STREAM}
            assert (await ensure_artifact_store(log)).actual == 3
        finally:
            await log.close()


async def test_a_two_node_cluster_gets_r1_without_a_mismatch_and_r3_fails_clearly(tmp_path: Path) -> None:
    with NatsCluster(tmp_path / "nats", nodes=2) as cluster:
        # Three replicas set by the operator on two nodes: a clear error, and nothing created.
        with pytest.raises(LogError, match=f"cannot create stream {ALL_STREAMS[0]} with 3 replicas: no suitable peers"):
            await JetStreamLog.connect(cluster.url, replicas=3)
        for outcome in (REPLICAS_CREATED, REPLICAS_OK):  # created, then found as it should be
            log = await JetStreamLog.connect(cluster.url)
            try:
                assert {(r.stream, r.outcome, r.wanted, r.actual) for r in log.replica_reports} == {
                    (name, outcome if name in GRID_STREAMS else REPLICAS_OK, 1, 1) for name in EVERY_STREAM}
                assert (await ensure_artifact_store(log)).actual == 1
            finally:
                await log.close()


async def test_a_refused_update_is_reported_with_the_command_that_fixes_it(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "single") as server:
        auto = await JetStreamLog.connect(server.url)
        try:
            assert not auto.clustered()
            assert await replica_counts(auto) == {name: (1, 1) for name in EVERY_STREAM}
        finally:
            await auto.close()
        log = await JetStreamLog.connect(server.url, replicas=3)
        try:
            reports = {r.stream: r for r in log.replica_reports}
            assert {n: r.outcome for n, r in reports.items()} == {n: REPLICAS_MISMATCH for n in EVERY_STREAM}
            assert reports["GRID_HOSTS"].fix == "nats stream edit GRID_HOSTS --replicas 3 --force"
            assert reports[f"KV_{LEASE_BUCKET}"].fix == f"nats stream edit KV_{LEASE_BUCKET} --replicas 3 --force"
            assert "non-clustered" in (reports["GRID_HOSTS"].error or "")
            # The log still works on the streams as they are.
            await log.append_raw("grid.ctl.tick", b"{}", msg_id="still-works")
        finally:
            await log.close()


async def test_new_streams_with_more_replicas_than_servers_fail_clearly(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "single") as server:
        with pytest.raises(LogError, match="with 3 replicas"):
            await JetStreamLog.connect(server.url, replicas=3)


def test_replicas_setting_is_checked() -> None:
    assert parse_replicas(None) is None and parse_replicas("") is None
    assert parse_replicas("3") == 3
    for bad in ("0", "6", "three", "-1"):
        with pytest.raises(ConfigError, match="GRID_REPLICAS"):
            parse_replicas(bad)
    cfg = GridConfig.from_environ({"GRID_HOME": "/nonexistent", "GRID_REPLICAS": "9"})
    with pytest.raises(ConfigError, match="from 1 to 5"):
        cfg.replicas()
    assert GridConfig.from_environ({"GRID_HOME": "/x", "GRID_REPLICAS": "5"}).replicas() == 5


def test_serve_controller_refuses_a_bad_replica_count(tmp_path: Path) -> None:
    env = {**os.environ, "GRID_HOME": str(tmp_path / "home"), "GRID_REPLICAS": "7"}
    proc = subprocess.run([sys.executable, "-m", "grid.cli.main", "serve", "controller", "--nats",
                           "nats://127.0.0.1:9", "--no-admin"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "--replicas / GRID_REPLICAS must be from 1 to 5" in proc.stderr


def test_up_refuses_a_bad_replica_count_before_starting_anything(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "GRID_HOME": str(home), "GRID_REPLICAS": "7"}
    proc = subprocess.run([sys.executable, "-m", "grid.cli.main", "up", "--nats", "nats://127.0.0.1:9"],
                          env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert "GRID_REPLICAS must be from 1 to 5" in proc.stdout + proc.stderr
    assert not (home / "nats.url").exists()


async def test_the_artifact_store_follows_the_replica_setting(nats_cluster: NatsCluster) -> None:
    """The object store bucket is replicated like the streams: R3 on three nodes, and a bucket
    someone created at R1 is grown in place."""
    first = await JetStreamLog.connect(nats_cluster.url, replicas=1)
    try:
        assert (await ensure_artifact_store(first)).actual == 1
    finally:
        await first.close()
    log = await JetStreamLog.connect(nats_cluster.urls[1])
    try:
        report = await ensure_artifact_store(log)
        assert (report.stream, report.outcome, report.actual) == (ARTIFACT_STREAM, REPLICAS_UPDATED, 3)
        info = await log.client.jetstream().stream_info(ARTIFACT_STREAM)
        assert info.config.num_replicas == 3
    finally:
        await log.close()
