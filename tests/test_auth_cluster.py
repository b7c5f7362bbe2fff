"""Users and ACLs on a real 3-node cluster (processes, sockets), through the native client and
real Kafka clients (kafka-python, confluent-kafka, aiokafka) over SASL/SCRAM-SHA-256.

The tests share one cluster and run in file order: the first creates the users (the cluster
is open until then), the later ones rely on them.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from laminar.client import Acl, Admin, Consumer, Producer, ShareConsumer, TopicPartition
from laminar.client.offsets import list_offsets
from laminar.errors import (
    AuthenticationError,
    AuthorizationError,
    InvalidRequestError,
    LaminarError,
)
from laminar.protocol import LATEST
from laminar.transport import split_address
from tests.cluster_fixture import ClusterHandle, run_sync, start_cluster

confluent_kafka = pytest.importorskip("confluent_kafka")
ck_admin = pytest.importorskip("confluent_kafka.admin")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")

pytestmark = pytest.mark.timeout(240)

ROOT = ("root", "root-secret")
READER = ("reader", "reader-secret")
WRITER = ("writer", "writer-secret")
OPS = ("ops", "ops-secret")
DATA = "data"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    # Checkpoints every 10 metadata commands: the logs are cut below them, so the restarts
    # below rebuild users and rules from a checkpoint (laminar/node/metadata_checkpoint.py).
    handle = start_cluster(
        tmp_path_factory.mktemp("auth"),
        3,
        kafka=True,
        extra_args=["--metadata-checkpoint-commands", "10"],
    )
    try:
        yield handle
    finally:
        handle.stop()


def login(user: tuple[str, str]) -> dict[str, str]:
    return {"username": user[0], "password": user[1]}


async def end_offset(cluster: ClusterHandle, topic: str, partition: int = 0) -> int:
    tp = TopicPartition(topic, partition)
    async with Consumer(cluster.bootstrap, **login(ROOT)) as consumer:
        return (await list_offsets(consumer.cluster, [tp], LATEST))[tp]


async def read_all(
    cluster: ClusterHandle, user: tuple[str, str], topic: str, count: int
) -> list[bytes]:
    """The first ``count`` records of partition 0 (fewer only if they do not come in 30 s)."""
    tp = TopicPartition(topic, 0)
    async with Consumer(cluster.bootstrap, **login(user)) as consumer:
        await consumer.assign([tp])
        await consumer.seek_to_beginning()
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < count and time.monotonic() < deadline:
            values += [r.value for r in await consumer.getmany(timeout_ms=1000)]
        return values[:count]


def kafka_unauthenticated_request_is_closed(address: str) -> bool:
    """A Metadata v1 request before SASL: the node closes the connection without a reply."""
    host, port = split_address(address)
    body = struct.pack(">hhih", 3, 1, 7, 4) + b"test" + struct.pack(">i", -1)
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        sock.settimeout(5)
        return sock.recv(4) == b""


def test_open_until_the_first_user_then_authentication_required(cluster: ClusterHandle) -> None:
    async def scenario() -> None:
        async with Admin(cluster.bootstrap) as admin:  # open: no users yet
            await admin.create_topic(DATA, partitions=1, replication_factor=3)
            async with Producer(cluster.bootstrap, linger_ms=1) as producer:
                await producer.send_and_wait(DATA, b"before users", partition=0)
            with pytest.raises(InvalidRequestError, match="first user must be a superuser"):
                await admin.create_user("alice", "pw")
            assert await admin.list_topics() == [DATA]  # still open after the refusal
            await admin.create_user(*ROOT, superuser=True)
            # This connection was opened before: it is refused from now on too.
            with pytest.raises(AuthenticationError, match="authentication required"):
                await admin.create_topic("sneaky", 1, 1)
        with pytest.raises(AuthenticationError, match="authentication required"):
            async with Admin(cluster.bootstrap) as admin:
                await admin.list_topics()
        with pytest.raises(AuthenticationError, match="wrong password"):
            async with Admin(cluster.bootstrap, username="root", password="nope"):
                pass
        with pytest.raises(AuthenticationError, match="unknown user"):
            async with Admin(cluster.bootstrap, username="nobody", password="nope"):
                pass
        with pytest.raises(AuthenticationError):
            async with Producer(cluster.bootstrap, linger_ms=1) as producer:
                await producer.send_and_wait(DATA, b"anonymous", partition=0)
        async with Admin(cluster.bootstrap, **login(ROOT)) as admin:
            assert await admin.list_topics() == [DATA]  # "sneaky" was never created
            await admin.create_user(*READER)
            await admin.create_user(*WRITER)
            await admin.create_user(*OPS)
            await admin.add_acl(Acl("reader", "consume", topic=DATA))
            await admin.add_acl(Acl("writer", "produce", prefix="dat"))
            await admin.add_acl(Acl("ops", "admin", prefix="ops-"))
            with pytest.raises(InvalidRequestError, match="last superuser"):
                await admin.delete_user("root")
            users = await admin.list_users()
            assert [(u.name, u.superuser) for u in users] == [
                ("ops", False),
                ("reader", False),
                ("root", True),
                ("writer", False),
            ]
            assert all(u.iterations >= 4096 for u in users)
        cluster.local.login = ROOT
        assert kafka_unauthenticated_request_is_closed(cluster.kafka_bootstrap.split(",")[0])

    run_sync(scenario())


def test_acls_refuse_and_allow_on_the_native_port(cluster: ClusterHandle) -> None:
    async def scenario() -> None:
        before = await end_offset(cluster, DATA)
        async with Producer(cluster.bootstrap, linger_ms=1, **login(READER)) as producer:
            with pytest.raises(AuthorizationError, match="may not produce"):
                await producer.send_and_wait(DATA, b"not allowed", partition=0)
        assert await end_offset(cluster, DATA) == before  # nothing stored
        async with Producer(cluster.bootstrap, linger_ms=1, **login(WRITER)) as producer:
            await producer.send_and_wait(DATA, b"from writer", partition=0)
        assert await read_all(cluster, READER, DATA, 2) == [b"before users", b"from writer"]
        with pytest.raises(AuthorizationError, match="may not consume"):
            await read_all(cluster, WRITER, DATA, 1)
        with pytest.raises(AuthorizationError):  # share groups need consume too
            async with ShareConsumer(cluster.bootstrap, "g", DATA, **login(WRITER)):
                pass
        async with Admin(cluster.bootstrap, **login(READER)) as admin:
            with pytest.raises(AuthorizationError, match="may not admin"):
                await admin.create_topic("reader-topic", 1, 1)
            with pytest.raises(AuthorizationError, match="may not admin"):
                await admin.delete_topic(DATA)
            with pytest.raises(AuthorizationError, match="superuser"):
                await admin.list_users()
            with pytest.raises(AuthorizationError, match="superuser"):
                await admin.create_user("mallory", "pw", superuser=True)
        async with Admin(cluster.bootstrap, **login(OPS)) as admin:
            await admin.create_topic("ops-1", 1, 3)  # forwarded to the metadata leader
            await admin.add_partitions("ops-1", 2)
            with pytest.raises(AuthorizationError):
                await admin.create_topic("elsewhere", 1, 1)
        # Group offsets: committing and reading them back needs consume on the topic.
        async with Consumer(
            cluster.bootstrap, group_id="readers", auto_offset_reset="earliest", **login(READER)
        ) as consumer:
            await consumer.subscribe([DATA])
            seen: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(seen) < 2 and time.monotonic() < deadline:
                seen += [r.value for r in await consumer.getmany(timeout_ms=1000)]
            assert seen == [b"before users", b"from writer"]
            await consumer.commit()
            end = await end_offset(cluster, DATA)
            assert await consumer.committed(TopicPartition(DATA, 0)) == end

    run_sync(scenario())


def cli(
    cluster: ClusterHandle, *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")}
    return subprocess.run(
        [sys.executable, "-m", "laminar", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, "LAMINAR_BOOTSTRAP": cluster.bootstrap, **(env or {})},
    )


def test_spark_source_plans_with_user_and_password(cluster: ClusterHandle) -> None:
    """The driver side of the Spark source (no JVM needed): its user/password options."""
    from spark_source.cluster_io import snapshot
    from spark_source.options import parse_options

    options = {"bootstrap": cluster.bootstrap, "topic": DATA}
    planned, _ = snapshot(parse_options({**options, "user": READER[0], "password": READER[1]}))
    assert planned.latest[(DATA, 0)] == run_sync(end_offset(cluster, DATA))
    with pytest.raises(AuthenticationError):
        snapshot(parse_options(options))
    with pytest.raises(AuthenticationError, match="wrong password"):
        snapshot(parse_options({**options, "user": READER[0], "password": "wrong"}))


def test_dead_letters_are_copied_with_the_internal_user(cluster: ClusterHandle) -> None:
    """A queue leader copies rejected messages to the dead-letter topic through the client
    port (creating it): it authenticates as the nodes' internal user."""

    async def scenario() -> None:
        async with ShareConsumer(
            cluster.bootstrap, "dlq-test", DATA, from_earliest=True, **login(ROOT)
        ) as consumer:
            messages = []
            deadline = time.monotonic() + 30
            while len(messages) < 2 and time.monotonic() < deadline:
                messages += await consumer.fetch(timeout_ms=1000)
            assert len(messages) == 2
            await asyncio.gather(*(m.reject() for m in messages))
        deadline = time.monotonic() + 30
        while True:
            try:
                copied = await read_all(cluster, ROOT, "dlq-test.dlq", 2)
                if len(copied) == 2:
                    break
            except Exception:
                if time.monotonic() > deadline:
                    raise
            assert time.monotonic() < deadline, "dead letters not copied"
            await asyncio.sleep(0.3)
        assert sorted(copied) == [b"before users", b"from writer"]

    run_sync(scenario())


def _kafka_python_producer(cluster: ClusterHandle, user: tuple[str, str]) -> Any:
    return kafka.KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap.split(","),
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username=user[0],
        sasl_plain_password=user[1],
        request_timeout_ms=10_000,
        max_block_ms=10_000,
    )


def _confluent(user: tuple[str, str], cluster: ClusterHandle, **extra: object) -> dict:
    return {
        "bootstrap.servers": cluster.kafka_bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": user[0],
        "sasl.password": user[1],
        **extra,
    }


def test_kafka_clients_authenticate_with_scram_and_acls_apply(cluster: ClusterHandle) -> None:
    before = run_sync(end_offset(cluster, DATA))
    producer = _kafka_python_producer(cluster, WRITER)
    try:
        producer.send(DATA, b"via kafka-python", partition=0).get(timeout=20)
    finally:
        producer.close()

    async def with_aiokafka() -> None:
        def producer(password: str) -> Any:
            return aiokafka.AIOKafkaProducer(
                bootstrap_servers=cluster.kafka_bootstrap,
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="SCRAM-SHA-256",
                sasl_plain_username=WRITER[0],
                sasl_plain_password=password,
            )

        wrong = producer("wrong")  # SASL_AUTHENTICATION_FAILED: no node lets it bootstrap
        with pytest.raises(aiokafka.errors.KafkaConnectionError):
            await wrong.start()
        await wrong.stop()
        right = producer(WRITER[1])
        await right.start()
        try:
            await right.send_and_wait(DATA, b"via aiokafka", partition=0)
        finally:
            await right.stop()

    run_sync(with_aiokafka())

    # confluent-kafka: the reader consumes what kafka-python wrote, and may not produce.
    consumer = confluent_kafka.Consumer(
        _confluent(
            READER,
            cluster,
            **{"group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"},
        )
    )
    got: list[bytes] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(DATA, 0, before)])
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                got.append(message.value())
    finally:
        consumer.close()
    assert got == [b"via kafka-python", b"via aiokafka"]

    errors: list[object] = []
    refused = confluent_kafka.Producer(
        _confluent(READER, cluster, **{"message.timeout.ms": 10_000})
    )
    refused.produce(
        DATA, b"reader may not", partition=0, on_delivery=lambda e, _m: errors.append(e)
    )
    refused.flush(20)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED

    admin = ck_admin.AdminClient(_confluent(READER, cluster))
    futures = admin.create_topics([ck_admin.NewTopic("kafka-made", 1, 1)], operation_timeout=10)
    with pytest.raises(confluent_kafka.KafkaException) as refused_create:
        futures["kafka-made"].result(timeout=20)
    assert (
        refused_create.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    assert run_sync(end_offset(cluster, DATA)) == before + 2  # nothing from the reader


def test_kafka_admin_manages_scram_users(cluster: ClusterHandle) -> None:
    """DescribeUserScramCredentials / AlterUserScramCredentials through confluent-kafka."""
    mechanism = ck_admin.ScramMechanism.SCRAM_SHA_256
    root = ck_admin.AdminClient(_confluent(ROOT, cluster))
    described = root.describe_user_scram_credentials().result(timeout=20)
    assert {"root", "reader", "writer", "ops"} <= set(described)
    assert described["reader"].scram_credential_infos[0].iterations == 4096
    upsert = ck_admin.UserScramCredentialUpsertion(
        "kuser", ck_admin.ScramCredentialInfo(mechanism, 8192), b"kuser-secret"
    )
    for future in root.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=20)
    # kuser can log in (its SCRAM credential came from librdkafka's salted password)...
    probe = ck_admin.AdminClient(_confluent(("kuser", "kuser-secret"), cluster))
    assert DATA in probe.list_topics(timeout=20).topics
    # ...but may not manage users: it is no superuser. (Not asked with a describe of every
    # user: librdkafka 2.16 aborts the process on that call's top-level error reply.)
    other = ck_admin.UserScramCredentialUpsertion(
        "other", ck_admin.ScramCredentialInfo(mechanism, 4096), b"other-secret"
    )
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        probe.alter_user_scram_credentials([other])["other"].result(timeout=20)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.CLUSTER_AUTHORIZATION_FAILED
    deletion = ck_admin.UserScramCredentialDeletion("kuser", mechanism)
    for future in root.alter_user_scram_credentials([deletion]).values():
        future.result(timeout=20)
    with pytest.raises(confluent_kafka.KafkaException) as gone:  # no such user any more
        root.describe_user_scram_credentials(["kuser"])["kuser"].result(timeout=20)
    assert gone.value.args[0].code() == confluent_kafka.KafkaError.RESOURCE_NOT_FOUND
    assert "other" not in root.describe_user_scram_credentials().result(timeout=20)


def test_kafka_admin_manages_acls(cluster: ClusterHandle) -> None:
    """CreateAcls / DescribeAcls / DeleteAcls through confluent-kafka, enforced natively."""
    k = ck_admin
    write_ops_1 = k.AclBinding(
        k.ResourceType.TOPIC,
        "ops-1",
        k.ResourcePatternType.LITERAL,
        "User:ops",
        "*",
        k.AclOperation.WRITE,
        k.AclPermissionType.ALLOW,
    )
    deny = k.AclBinding(
        k.ResourceType.TOPIC,
        "ops-1",
        k.ResourcePatternType.LITERAL,
        "User:ops",
        "*",
        k.AclOperation.READ,
        k.AclPermissionType.DENY,
    )
    root = k.AdminClient(_confluent(ROOT, cluster))
    created = root.create_acls([write_ops_1, deny])
    created[write_ops_1].result(timeout=20)
    with pytest.raises(confluent_kafka.KafkaException, match="only allow"):
        created[deny].result(timeout=20)
    reader = k.AdminClient(_confluent(READER, cluster))
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        reader.create_acls([write_ops_1])[write_ops_1].result(timeout=20)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.CLUSTER_AUTHORIZATION_FAILED

    ops_filter = k.AclBindingFilter(
        k.ResourceType.ANY,
        None,
        k.ResourcePatternType.ANY,
        "User:ops",
        None,
        k.AclOperation.ANY,
        k.AclPermissionType.ANY,
    )
    found = root.describe_acls(ops_filter).result(timeout=20)
    assert sorted((b.name, b.resource_pattern_type.name, b.operation.name) for b in found) == [
        ("ops-", "PREFIXED", "ALTER"),
        ("ops-1", "LITERAL", "WRITE"),
    ]

    async def ops_produces() -> None:
        async with Producer(cluster.bootstrap, linger_ms=1, **login(OPS)) as producer:
            await producer.send_and_wait("ops-1", b"by ops", partition=0)

    run_sync(ops_produces())  # the rule made through Kafka applies on the native port
    write_filter = k.AclBindingFilter(
        k.ResourceType.TOPIC,
        "ops-1",
        k.ResourcePatternType.MATCH,
        "User:ops",
        "*",
        k.AclOperation.WRITE,
        k.AclPermissionType.ALLOW,
    )
    deleted = root.delete_acls([write_filter])[write_filter].result(timeout=20)
    assert [(b.name, b.operation.name) for b in deleted] == [("ops-1", "WRITE")]
    # Each node applies the deletion from the metadata log, a moment apart: the partition's
    # leader may still allow a write just after another node answered (as Kafka's brokers).
    deadline = time.monotonic() + 10
    while True:
        try:
            run_sync(ops_produces())
        except AuthorizationError:
            break
        assert time.monotonic() < deadline, "ops still writes 10 s after its ACL was deleted"
        time.sleep(0.2)


def test_users_and_acls_survive_leader_kill_and_full_restart(cluster: ClusterHandle) -> None:
    async def leader() -> int:
        async with Admin(cluster.bootstrap, **login(ROOT)) as admin:
            return (await admin.cluster_status()).metadata_leader

    async def still_enforced() -> None:
        assert len(await read_all(cluster, READER, DATA, 4)) == 4
        with pytest.raises(AuthenticationError):
            async with Admin(cluster.bootstrap, username="reader", password="wrong"):
                pass
        with pytest.raises(AuthenticationError):
            async with Admin(cluster.bootstrap) as admin:
                await admin.list_topics()
        async with Producer(cluster.bootstrap, linger_ms=1, **login(READER)) as producer:
            with pytest.raises(AuthorizationError):
                await producer.send_and_wait(DATA, b"no", partition=0)
        async with Admin(cluster.bootstrap, **login(ROOT)) as admin:
            assert Acl("reader", "consume", topic=DATA) in await admin.list_acls()
            await admin.create_topic(f"after-{uuid.uuid4().hex[:6]}", 2, 3)

    async def new_leader(killed: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if (await leader()) not in (0, killed):
                    return
            except (ConnectionError, LaminarError):
                pass
            await asyncio.sleep(0.2)
        raise AssertionError("no new metadata leader")

    killed = run_sync(leader())
    cluster.kill(killed)  # SIGKILL the metadata leader
    run_sync(new_leader(killed))
    run_sync(still_enforced())
    cluster.start_node(killed)
    cluster.wait_ready()
    cluster.stop()
    for node_id in cluster.nodes:
        cluster.start_node(node_id)
    cluster.wait_ready()
    run_sync(still_enforced())


def test_cli_manages_users_and_acls(cluster: ClusterHandle) -> None:
    refused = cli(cluster, "topic", "list")
    assert refused.returncode == 1
    assert "authentication required" in refused.stderr
    root = {"LAMINAR_USER": ROOT[0], "LAMINAR_PASSWORD": ROOT[1]}
    made = cli(cluster, "user", "create", "carol", "--password-stdin", stdin="carol-pw\n", env=root)
    assert made.returncode == 0, made.stderr
    added = cli(
        cluster, "acl", "add", "--user", "carol", "--op", "produce", "--topic", DATA, env=root
    )
    assert added.returncode == 0, added.stderr
    listed = cli(cluster, "acl", "list", "--user", "carol", env=root)
    assert listed.stdout.split("\n")[1].split() == ["carol", "produce", "topic", DATA]
    carol = ["--user", "carol", "--password", "carol-pw"]
    sent = cli(cluster, *carol, "produce", DATA, "--value", "from the cli", "--partition", "0")
    assert sent.returncode == 0, sent.stderr
    users = cli(cluster, "user", "list", env=root)
    assert "carol" in users.stdout and "root" in users.stdout and "superuser" in users.stdout
    changed = cli(cluster, "user", "passwd", "carol", "--password", "new-pw", env=root)
    assert changed.returncode == 0, changed.stderr
    old = cli(cluster, *carol, "topic", "list")
    assert old.returncode == 1 and "wrong password" in old.stderr
    carol = ["--user", "carol", "--password", "new-pw"]
    assert cli(cluster, *carol, "topic", "list").returncode == 0
    assert cli(cluster, "user", "delete", "carol", env=root).returncode == 0
    gone = cli(cluster, *carol, "topic", "list")
    assert gone.returncode == 1 and "unknown user" in gone.stderr
