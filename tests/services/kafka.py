"""A throwaway single-node Apache Kafka broker (KRaft) for the tests and for local use.

``start(DIR)`` runs the official broker jars from Maven Central (fetched once by
``scripts/fetch-jars.sh`` into ``.cache/jars/broker``; versions pinned in ``jars/pom.xml``) as
one combined broker+controller process on 127.0.0.1, formats its storage the first time, and
waits until a client can fetch metadata. ``stop(DIR)`` stops it: SIGTERM, then SIGKILL to the
process group after 30 s. Everything lives in DIR::

    DIR/server.properties   broker config (ports are kept across restarts)
    DIR/log4j2.properties   logging config (INFO to stdout)
    DIR/broker.log          the broker's stdout and stderr
    DIR/broker.pid          pid of the running broker (also its process group)
    DIR/data/               log.dirs, including the KRaft metadata log

Topics are not auto-created; use :meth:`KafkaBroker.create_topic`. Replication factors and
min.insync.replicas of the internal topics are 1, so transactions work on a single node.
For broker faults: :meth:`KafkaBroker.restart` (clean shutdown, same port and data) and
:meth:`KafkaBroker.kill` (SIGKILL) followed by :func:`start` on the same DIR.

``start_cluster(DIR)`` runs three such nodes instead (``DIR/node1`` ... ``DIR/node3``, one
cluster id, a static 3-voter quorum) with replication factor 3 everywhere and
``min.insync.replicas=2`` (:data:`CLUSTER_SETTINGS`); :class:`KafkaCluster` kills and restarts
single nodes and finds a partition's leader, a transactional id's coordinator and the active
controller.

Command line (from the repository root)::

    python -m tests.services.kafka start DIR [--port N]   # prints the bootstrap address
    python -m tests.services.kafka stop DIR
    python -m tests.services.kafka kill-node DIR N    # SIGKILL node N of start_cluster(DIR)
    python -m tests.services.kafka start-node DIR N   # start it again, from any process

If ``SPARKONCE_TEST_KAFKA_BOOTSTRAP`` is set (``host:port``), :func:`session_broker` uses that
broker instead of starting one (and such a broker cannot be stopped or restarted by the tests).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import os
import pathlib
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tests.services.process import (
    HOST,
    ProcFacts,
    ServiceProcesses,
    command_line,
    free_port,
    log_tail,
)

__all__ = [
    "KafkaBroker",
    "KafkaCluster",
    "jar_dir",
    "session_broker",
    "start",
    "start_cluster",
    "stop",
]

ENV_BOOTSTRAP = "SPARKONCE_TEST_KAFKA_BOOTSTRAP"
ENV_JAR_CACHE = "SPARKONCE_JAR_CACHE"  # same variable as scripts/fetch-jars.sh
NODE_ID = 1
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
TOPIC_TIMEOUT_S = 30.0
HEAP = "-Xmx512m"
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"

PROPS_NAME = "server.properties"
LOG4J_NAME = "log4j2.properties"
LOG_NAME = "broker.log"
PID_NAME = "broker.pid"
DATA_NAME = "data"

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
POM = REPO_ROOT / "jars" / "pom.xml"
FETCH_SCRIPT = REPO_ROOT / "scripts" / "fetch-jars.sh"

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.state.name = state.change.logger
logger.state.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
"""


def _is_broker_of(facts: ProcFacts, workdir: pathlib.Path) -> bool:
    props = str(workdir / PROPS_NAME).encode()
    return MAIN_CLASS.encode() in facts.cmdline and props in facts.cmdline


# The brokers: the ones this Python process started are kept so that they can be reaped (a
# zombie still answers kill(pid, 0)).
_brokers = ServiceProcesses(PID_NAME, _is_broker_of)


@dataclasses.dataclass
class KafkaBroker:
    """A running broker. ``workdir`` and ``pid`` are None for an external broker.

    :meth:`restart` replaces ``pid`` in place, so fixtures can keep handing out the same object.
    """

    bootstrap: str
    workdir: pathlib.Path | None
    pid: int | None

    @property
    def port(self) -> int:
        return int(self.bootstrap.rsplit(":", 1)[1])

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})

    def create_topic(self, name: str, partitions: int, *, exist_ok: bool = False) -> None:
        """Create topic ``name`` (replication factor 1); return once every partition has a leader
        in the metadata the broker serves to clients."""
        admin = self.admin()
        future = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            operation_timeout=TOPIC_TIMEOUT_S,
            request_timeout=TOPIC_TIMEOUT_S,
        )[name]
        try:
            future.result()
        except KafkaException as exc:
            err = exc.args[0]
            if not (exist_ok and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise
        deadline = time.monotonic() + TOPIC_TIMEOUT_S
        while True:
            meta = admin.list_topics(topic=name, timeout=5).topics.get(name)
            if (
                meta is not None
                and meta.error is None
                and len(meta.partitions) >= partitions
                and all(p.leader >= 0 and p.error is None for p in meta.partitions.values())
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"topic {name!r} not visible with {partitions} led partitions after "
                    f"{TOPIC_TIMEOUT_S:.0f} s: {meta}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the broker gracefully (SIGTERM; SIGKILL after 30 s)."""
        stop(self._own_workdir("stop"))
        self.pid = None

    def kill(self) -> None:
        """Crash the broker: SIGKILL its process group, no clean shutdown."""
        stop(self._own_workdir("kill"), timeout=0.0)
        self.pid = None

    def restart(self) -> None:
        """Stop the broker, then start it again on the same port with the same data."""
        workdir = self._own_workdir("restart")
        stop(workdir)
        self.pid = start(workdir, port=self.port).pid

    def _own_workdir(self, what: str) -> pathlib.Path:
        if self.workdir is None:
            raise RuntimeError(f"cannot {what} the external broker at {self.bootstrap}")
        return self.workdir


# --- jars --------------------------------------------------------------------------------------


def jar_dir(kind: str = "broker") -> pathlib.Path:
    """The jar cache directory ``kind`` ("broker" or "spark-kafka"), fetching it if needed."""
    cache = pathlib.Path(os.environ.get(ENV_JAR_CACHE) or REPO_ROOT / ".cache" / "jars")
    directory = cache / kind
    stamp = directory / ".stamp"
    checksum = hashlib.sha256(POM.read_bytes()).hexdigest()
    if not (stamp.is_file() and stamp.read_text().strip() == checksum):
        proc = subprocess.run(
            ["bash", str(FETCH_SCRIPT)], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{FETCH_SCRIPT} failed (exit code {proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}".rstrip()
            )
    if not any(directory.glob("*.jar")):
        raise RuntimeError(f"no jars in {directory} after running {FETCH_SCRIPT}")
    return directory


def _java(jars: pathlib.Path, heap: str, log4j: pathlib.Path, *args: str) -> list[str]:
    return [
        "java",
        heap,
        # C1 only: starts ~35% faster and uses less memory; plenty for test traffic.
        "-XX:TieredStopAtLevel=1",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        f"{jars}/*",
        *args,
    ]


# --- config and storage ------------------------------------------------------------------------


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker does
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _read_props(path: pathlib.Path) -> dict[str, str]:
    props: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "!")) and "=" in line:
                key, value = line.split("=", 1)
                props[key.strip()] = value.strip()
    return props


def _ports_from(props: dict[str, str]) -> tuple[int, int] | None:
    """(client port, controller port) recorded in an existing server.properties."""
    try:
        port = int(props["advertised.listeners"].rsplit(":", 1)[1])
        cport = int(props["controller.quorum.voters"].rsplit(":", 1)[1])
    except (KeyError, IndexError, ValueError):
        return None
    return port, cport


def _write_config(
    workdir: pathlib.Path,
    port: int,
    cport: int,
    *,
    node_id: int = NODE_ID,
    voters: str | None = None,
    overrides: dict[str, str] | None = None,
) -> None:
    """Write the node's config. ``voters`` (``id@host:port,...``): the static quorum of a
    cluster (default: this node alone); ``overrides`` replace or add settings."""
    data = workdir / DATA_NAME
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        # A static quorum: the controller ports may change between runs of a single node.
        "controller.quorum.voters": voters or f"{node_id}@{HOST}:{cport}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{cport}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Fewer partitions for the internal topics: creating 50 each on first use is slow.
        "offsets.topic.num.partitions": "5",
        "transaction.state.log.num.partitions": "5",
        # After a SIGKILL the restarted broker waits for its old registration's session to
        # expire before it is unfenced (default 9 s).
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
        # The log cleaner preallocates this on the heap (default 128 MiB).
        "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
        **(overrides or {}),
    }
    text = "# written by tests/services/kafka.py; rewritten on every start\n" + "".join(
        f"{k}={v}\n" for k, v in settings.items()
    )
    (workdir / PROPS_NAME).write_text(text)
    (workdir / LOG4J_NAME).write_text(_LOG4J2)


def _cluster_id() -> str:
    """A random cluster id in Kafka's Uuid text form (22 chars of unpadded URL-safe base64)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _format(workdir: pathlib.Path, jars: pathlib.Path, cluster_id: str | None = None) -> None:
    if (workdir / DATA_NAME / "meta.properties").exists():
        return
    cmd = _java(
        jars,
        "-Xmx256m",
        workdir / LOG4J_NAME,
        STORAGE_TOOL,
        "format",
        "--cluster-id",
        cluster_id or _cluster_id(),
        "--config",
        str(workdir / PROPS_NAME),
    )
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed with exit code {proc.returncode}:\n"
            f"{proc.stdout}{proc.stderr}".rstrip()
        )


# --- processes ---------------------------------------------------------------------------------


def _formatted_cluster_id(workdir: pathlib.Path) -> str | None:
    return _read_props(workdir / DATA_NAME / "meta.properties").get("cluster.id")


def _metadata_ok(bootstrap: str, cluster_id: str | None) -> bool:
    """Whether the broker at ``bootstrap`` serves metadata, and is the one formatted with
    ``cluster_id`` (not some other process on that port)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        meta = admin.list_topics(timeout=2)
    except KafkaException:
        return False
    return cluster_id is None or meta.cluster_id == cluster_id


class _StartupFailed(RuntimeError):
    pass


def _wait_ready(
    broker: KafkaBroker, proc: subprocess.Popen[bytes] | None, log: pathlib.Path, since: int
) -> None:
    assert broker.workdir is not None
    cluster_id = _formatted_cluster_id(broker.workdir)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise _StartupFailed(
                f"Kafka broker exited with code {proc.returncode} during startup; "
                f"tail of {log}:\n{log_tail(log, since, missing='(no broker log)')}"
            )
        if _metadata_ok(broker.bootstrap, cluster_id):
            return
        time.sleep(0.2)
    raise RuntimeError(
        f"Kafka broker at {broker.bootstrap} not ready within {STARTUP_TIMEOUT_S:.0f} s; "
        f"tail of {log}:\n{log_tail(log, since, missing='(no broker log)')}"
    )


def _launch(workdir: pathlib.Path, jars: pathlib.Path, heap: str = HEAP) -> subprocess.Popen[bytes]:
    cmd = _java(jars, heap, workdir / LOG4J_NAME, MAIN_CLASS, str(workdir / PROPS_NAME))
    with (workdir / LOG_NAME).open("ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() signals the whole group
        )
    _brokers.children[proc.pid] = proc
    (workdir / PID_NAME).write_text(f"{proc.pid}\n")
    return proc


def start(workdir: pathlib.Path, port: int | None = None) -> KafkaBroker:
    """Start a broker with its config and data in ``workdir``; reuse one already running there.

    ``port`` is the client (PLAINTEXT) port; by default the port of the previous run in
    ``workdir``, else a free one.
    """
    workdir = pathlib.Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / LOG_NAME
    previous = _ports_from(_read_props(workdir / PROPS_NAME))

    pid = _brokers.running_pid(workdir)
    if pid is not None:
        if previous is None or (port is not None and port != previous[0]):
            raise RuntimeError(f"a broker (pid {pid}) already runs in {workdir} on another port")
        broker = KafkaBroker(f"{HOST}:{previous[0]}", workdir, pid)
        _wait_ready(broker, None, log, 0)
        return broker

    jars = jar_dir("broker")
    # A free port can be taken before the broker binds it: retry with fresh ones, unless the
    # ports are fixed (given, or kept from a previous run so clients can reconnect).
    attempts = 1 if (port is not None or previous is not None) else 3
    for attempt in range(attempts):
        chosen = port if port is not None else (previous[0] if previous else free_port())
        cport = previous[1] if previous else free_port()
        while cport == chosen:
            cport = free_port()
        busy = [p for p in (chosen, cport) if not _port_free(p)]
        if busy:
            if attempt + 1 < attempts:
                continue
            raise RuntimeError(
                f"cannot start a Kafka broker in {workdir}: {HOST}:{busy[0]} is in use"
            )
        _write_config(workdir, chosen, cport)
        _format(workdir, jars)
        since = log.stat().st_size if log.exists() else 0
        proc = _launch(workdir, jars)
        broker = KafkaBroker(f"{HOST}:{chosen}", workdir, proc.pid)
        try:
            _wait_ready(broker, proc, log, since)
        except _StartupFailed:
            stop(workdir, timeout=0.0)  # reaps it and removes the pid file
            bind_error = "Address already in use" in log_tail(log, since, lines=400)
            if attempt + 1 < attempts and bind_error:
                continue
            raise
        except BaseException:
            stop(workdir, timeout=0.0)
            raise
        return broker
    raise AssertionError("unreachable")


def running_pid(workdir: pathlib.Path) -> int | None:
    """The pid of the broker running for ``workdir`` (started by any process), or None."""
    return _brokers.running_pid(pathlib.Path(workdir).absolute())


def stop(workdir: pathlib.Path, timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop the broker in ``workdir``: SIGTERM, then after ``timeout`` s SIGKILL its process
    group. ``timeout=0`` kills at once. Does nothing if no broker runs there."""
    _brokers.stop(pathlib.Path(workdir).absolute(), timeout)


def session_broker(tmp_root: pathlib.Path) -> Iterator[KafkaBroker]:
    """Generator for a session fixture: a broker with its files in ``tmp_root/kafka``.

    With ``SPARKONCE_TEST_KAFKA_BOOTSTRAP`` set, yields that broker and starts/stops nothing.
    """
    external = os.environ.get(ENV_BOOTSTRAP)
    if external:
        yield KafkaBroker(external, None, None)
        return
    workdir = pathlib.Path(tmp_root) / "kafka"
    try:
        yield start(workdir)
    finally:
        stop(workdir)


# --- a 3-node cluster ----------------------------------------------------------------------------

CLUSTER_SIZE = 3
CLUSTER_HEAP = "-Xmx384m"
# Replicated like a production cluster: every topic (internal ones too) on 3 brokers, and a
# write acknowledged only once 2 of them have it.
CLUSTER_SETTINGS = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "unclean.leader.election.enable": "false",
}
QUORUM_STATE = "__cluster_metadata-0/quorum-state"


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units, 32-bit signed)."""
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


@dataclasses.dataclass
class KafkaCluster:
    """A running 3-node KRaft cluster on 127.0.0.1: each node a combined broker+controller JVM
    (a 3-voter quorum), with the replication of :data:`CLUSTER_SETTINGS`.

    ``nodes`` maps node id to its :class:`KafkaBroker` (``pid`` None while it is down).
    :meth:`kill` crashes one node (SIGKILL), :meth:`start_node` brings it back on the same
    ports with its data; :meth:`leader`, :meth:`coordinator` and :meth:`controller` say which
    node holds a role now.
    """

    workdir: pathlib.Path
    nodes: dict[int, KafkaBroker]

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.nodes.values())

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})

    def create_topic(self, name: str, partitions: int, replication_factor: int = -1) -> None:
        """Create topic ``name`` (default: the cluster's replication factor, 3) and wait until
        every partition has a leader."""
        admin = self.admin()
        admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor)],
            operation_timeout=TOPIC_TIMEOUT_S,
            request_timeout=TOPIC_TIMEOUT_S,
        )[name].result()
        self._wait(lambda: len(self.partitions(name)) >= partitions, f"topic {name!r} led")

    def partitions(self, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
        """Partition -> (leader, replicas, in-sync replicas), from the metadata served now
        (partitions without a leader left out)."""
        meta = self.admin().list_topics(topic=topic, timeout=5).topics.get(topic)
        if meta is None or meta.error is not None:
            return {}
        return {
            p: (m.leader, list(m.replicas), list(m.isrs))
            for p, m in meta.partitions.items()
            if m.leader >= 0 and m.error is None
        }

    def replication_factor(self, topic: str) -> int:
        """The replica count of ``topic``, asked with Kafka's DescribeTopics."""
        from confluent_kafka import TopicCollection

        found: list[Any] = []

        def described() -> bool:
            # A node that has not applied the topic's creation yet does not know it.
            admin = self.admin()  # keep a reference: a collected client cancels its futures
            found.append(admin.describe_topics(TopicCollection([topic]))[topic].result(10))
            return True

        self._wait(described, f"a description of topic {topic!r}")
        desc = found[-1]
        counts = {len(p.replicas) for p in desc.partitions}
        assert len(counts) == 1, f"partitions of {topic} differ in replica count: {desc}"
        return counts.pop()

    def leader(self, topic: str, partition: int = 0) -> int:
        """The node leading ``topic[partition]`` now."""
        found: list[int] = []

        def led() -> bool:
            part = self.partitions(topic).get(partition)
            if part is not None:
                found.append(part[0])
            return bool(found)

        self._wait(led, f"a leader of {topic}[{partition}]")
        return found[-1]

    def coordinator(self, transactional_id: str) -> int:
        """The node that is the transaction coordinator of ``transactional_id`` now: the
        leader of its ``__transaction_state`` partition (Kafka's own mapping: the absolute
        value of the id's Java hash code, modulo the partition count)."""
        if not self.partitions("__transaction_state"):
            self._create_transaction_log()
        some = next(iter(self.nodes.values())).workdir
        assert some is not None
        count = int(_read_props(some / PROPS_NAME)["transaction.state.log.num.partitions"])
        h = java_string_hash(transactional_id)
        partition = 0 if h == -(1 << 31) else abs(h) % count
        return self.leader("__transaction_state", partition)

    def _create_transaction_log(self) -> None:
        """Make the cluster create ``__transaction_state`` (on the first transactional
        producer's start), with a producer id of its own, so no tested id is fenced."""
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": "tests-services-kafka-probe",
                "log_level": 0,
            }
        )
        producer.init_transactions(TOPIC_TIMEOUT_S)
        producer.flush(1)

    def controller(self) -> int:
        """The active controller: the leader in the quorum state of the newest epoch among
        the running nodes (each node writes its view to its metadata log directory)."""
        import json

        best = (-1, -1)
        for broker in self.nodes.values():
            if broker.pid is None or broker.workdir is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                state = json.loads((broker.workdir / DATA_NAME / QUORUM_STATE).read_text())
                epoch, leader = int(state.get("leaderEpoch", -1)), int(state.get("leaderId", -1))
                if leader >= 0 and epoch > best[0]:
                    best = (epoch, leader)
        if best[1] < 0:
            raise RuntimeError(f"no running node of {self.workdir} knows a quorum leader")
        return best[1]

    def kill(self, node_id: int) -> None:
        """Crash node ``node_id``: SIGKILL, no clean shutdown."""
        self.nodes[node_id].kill()

    def start_node(self, node_id: int) -> None:
        """Start node ``node_id`` again (same ports, same data) and wait until it serves."""
        broker = self.nodes[node_id]
        assert broker.workdir is not None
        jars = jar_dir("broker")
        log = broker.workdir / LOG_NAME
        since = log.stat().st_size if log.exists() else 0
        proc = _launch(broker.workdir, jars, CLUSTER_HEAP)
        broker.pid = proc.pid
        _wait_ready(broker, proc, log, since)

    def wait_in_sync(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Wait until every partition of every topic has all its replicas in sync (after a
        node came back), so that the next kill leaves min.insync.replicas."""

        def synced() -> bool:
            meta = self.admin().list_topics(timeout=5)
            return len(meta.brokers) == len(self.nodes) and all(
                p.leader >= 0 and sorted(p.isrs) == sorted(p.replicas)
                for t in meta.topics.values()
                for p in t.partitions.values()
            )

        self._wait(synced, "every replica in sync", timeout)

    def stop(self) -> None:
        for broker in self.nodes.values():
            if broker.workdir is not None:
                stop(broker.workdir, timeout=0.0)
            broker.pid = None

    def _wait(self, check: Callable[[], bool], what: str, timeout: float = TOPIC_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(KafkaException):
                if check():
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{what}: not reached within {timeout:.0f} s at {self.bootstrap}"
                )
            time.sleep(0.1)


def start_cluster(workdir: pathlib.Path, size: int = CLUSTER_SIZE) -> KafkaCluster:
    """Start a ``size``-node KRaft cluster with its files in ``workdir/node<N>``: all nodes at
    once (a quorum needs a majority to elect a controller), each formatted with one cluster id."""
    workdir = pathlib.Path(workdir).absolute()
    jars = jar_dir("broker")
    ports = {n: (free_port(), free_port()) for n in range(1, size + 1)}
    voters = ",".join(f"{n}@{HOST}:{c}" for n, (_, c) in ports.items())
    cluster_id = _cluster_id()
    nodes: dict[int, KafkaBroker] = {}
    procs: dict[int, subprocess.Popen[bytes]] = {}
    for n, (port, cport) in ports.items():
        node_dir = workdir / f"node{n}"
        node_dir.mkdir(parents=True, exist_ok=True)
        _write_config(node_dir, port, cport, node_id=n, voters=voters, overrides=CLUSTER_SETTINGS)
        _format(node_dir, jars, cluster_id)
    cluster = KafkaCluster(workdir, nodes)
    try:
        for n, (port, _) in ports.items():
            node_dir = workdir / f"node{n}"
            procs[n] = _launch(node_dir, jars, CLUSTER_HEAP)
            nodes[n] = KafkaBroker(f"{HOST}:{port}", node_dir, procs[n].pid)
        for n, broker in nodes.items():
            assert broker.workdir is not None
            _wait_ready(broker, procs[n], broker.workdir / LOG_NAME, 0)
        cluster._wait(
            lambda: len(cluster.admin().list_topics(timeout=5).brokers) == size,
            f"all {size} brokers registered",
            STARTUP_TIMEOUT_S,
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_cluster_node(node_dir: pathlib.Path) -> KafkaBroker:
    """Start the stopped node of a :func:`start_cluster` cluster in ``node_dir`` again (same
    ports, same data; from any process) and wait until it serves."""
    node_dir = pathlib.Path(node_dir).absolute()
    ports = _ports_from(_read_props(node_dir / PROPS_NAME))
    if ports is None:
        raise RuntimeError(f"{node_dir} holds no node of a cluster (no {PROPS_NAME})")
    if _brokers.running_pid(node_dir) is not None:
        raise RuntimeError(f"the node in {node_dir} is running already")
    log = node_dir / LOG_NAME
    since = log.stat().st_size if log.exists() else 0
    proc = _launch(node_dir, jar_dir("broker"), CLUSTER_HEAP)
    broker = KafkaBroker(f"{HOST}:{ports[0]}", node_dir, proc.pid)
    _wait_ready(broker, proc, log, since)
    return broker


# --- command line ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    return command_line(
        argv,
        module="tests.services.kafka",
        description="Start or stop a throwaway single-node Kafka broker for the sparkonce tests.",
        noun="broker",
        start=lambda workdir, port: start(workdir, port=port).bootstrap,
        stop=stop,
        node_commands={
            "kill-node": ("SIGKILL", lambda node: stop(node, timeout=0.0)),
            "start-node": ("start again", start_cluster_node),
        },
    )


if __name__ == "__main__":
    sys.exit(main())
