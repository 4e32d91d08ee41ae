"""Kafka client plumbing shared by the Kafka source, sink and producer (confluent-kafka).

Everything that talks to a broker goes through :class:`KafkaConnection`: it
validates the bootstrap servers, keeps secret client settings out of reprs and
logs, and turns librdkafka's errors into sparkonce errors that name the
bootstrap servers and say what to do.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sparkonce.config import is_count
from sparkonce.errors import ConfigError, KafkaUnavailableError, TopicNotFoundError

# KafkaUnavailableError lives in sparkonce.errors; it is importable from here too for
# code written before it moved (`from sparkonce.kafka.client import KafkaUnavailableError`).
__all__ = [
    "FATAL",
    "LEADER_MOVED",
    "NO_ANSWER",
    "RETRY_S",
    "TIMEOUT_S",
    "TRANSACTION_OPEN",
    "ClusterDefaults",
    "KafkaConnection",
    "KafkaUnavailableError",
    "classify",
    "masked",
    "parse_bootstrap",
    "scrub",
]

# Client settings whose values are never printed.
_SECRET = re.compile(r"(password|secret|token|credentials|\.key$|\.pem$)", re.IGNORECASE)
_HOSTPORT = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")
TIMEOUT_S = 10.0
# How long queries and reads keep retrying across leader changes and broker restarts (the
# transient errors of ``classify``) before they give up: about what Kafka's own clients
# allow an operation (default.api.timeout.ms is 60 s, delivery.timeout.ms 120 s).
RETRY_S = 120.0
_RDKAFKA_LOG = logging.getLogger("sparkonce.kafka.librdkafka")
_log = logging.getLogger(__name__)
_T = TypeVar("_T")

# What a KafkaUnavailableError says happened (its ``kind``).
NO_ANSWER = "no answer"  # no broker answered (down, unreachable, timed out): transient
LEADER_MOVED = "leader moved"  # a broker answered: the partition's leader moved: transient
TRANSACTION_OPEN = "transaction open"  # the cluster answered; an open transaction holds reads
FATAL = "fatal"  # the client cannot go on (fatal librdkafka error): never retried
# A broker answered that it does not know a topic that exists (just created: the cluster's
# metadata reaches every broker within moments). Only said where the topic is known to
# exist; elsewhere an unknown topic is a missing topic, never retried.
TOPIC_NOT_YET_KNOWN = "topic not yet known"
TRANSIENT = (NO_ANSWER, LEADER_MOVED, TOPIC_NOT_YET_KNOWN)

# librdkafka error names (confluent_kafka.KafkaError attributes) by what they say.
_NO_ANSWER_CODES = (
    "_TIMED_OUT",
    "_TIMED_OUT_QUEUE",
    "_TRANSPORT",
    "_ALL_BROKERS_DOWN",
    "_RESOLVE",
    "REQUEST_TIMED_OUT",
    "NETWORK_EXCEPTION",
    "BROKER_NOT_AVAILABLE",
)
_LEADER_MOVED_CODES = (
    # The broker a request was waiting on left the cluster's metadata (killed, fenced):
    # librdkafka destroys its handle and fails what it had in flight.
    "_DESTROY_BROKER",
    "NOT_LEADER_FOR_PARTITION",  # NOT_LEADER_OR_FOLLOWER in Kafka's own names
    "LEADER_NOT_AVAILABLE",
    "FENCED_LEADER_EPOCH",
    "UNKNOWN_LEADER_EPOCH",
    "OFFSET_NOT_AVAILABLE",  # a new leader that does not know its high watermark yet
    "REPLICA_NOT_AVAILABLE",
    "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "KAFKA_STORAGE_ERROR",
    "NOT_COORDINATOR",
    "COORDINATOR_NOT_AVAILABLE",
    "COORDINATOR_LOAD_IN_PROGRESS",
)


def classify(exc: BaseException | Any) -> str | None:
    """What a Kafka client error says: :data:`NO_ANSWER` or :data:`LEADER_MOVED` (transient:
    a broker restarting, a leader election), :data:`FATAL`, or None (anything else: a
    missing topic, a refused request...). ``exc`` is a ``KafkaException``, a
    ``KafkaError`` or a :class:`KafkaUnavailableError` (its ``kind``)."""
    if isinstance(exc, KafkaUnavailableError):
        return exc.kind
    err = exc.args[0] if isinstance(exc, BaseException) and exc.args else exc
    code = getattr(err, "code", None)
    if not callable(code):
        return None
    fatal = getattr(err, "fatal", None)
    if callable(fatal) and fatal():
        return FATAL
    from confluent_kafka import KafkaError

    value = code()
    if value in {getattr(KafkaError, n, None) for n in _NO_ANSWER_CODES}:
        return NO_ANSWER
    if value in {getattr(KafkaError, n, None) for n in _LEADER_MOVED_CODES}:
        return LEADER_MOVED
    return None


def parse_bootstrap(value: str) -> str:
    """Validate ``host:port[,host:port...]`` and return it normalized (no spaces)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            "bootstrap_servers is empty: pass the broker address list, e.g. '127.0.0.1:9092'"
        )
    parts = [p.strip() for p in value.split(",") if p.strip()]
    for part in parts:
        port = part.rsplit(":", 1)[-1]
        if not _HOSTPORT.match(part) or not 0 < int(port) < 65536:
            raise ConfigError(
                f"bootstrap server {part!r} is not host:port (in {value!r}); "
                "use a comma-separated list such as 'broker1:9092,broker2:9092'"
            )
    return ",".join(parts)


def masked(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with secret values replaced by ``***`` (safe for logs and reprs)."""
    return {k: ("***" if _SECRET.search(k) else v) for k, v in config.items()}


def scrub(text: str, config: Mapping[str, Any]) -> str:
    """``text`` with the values of secret settings in ``config`` replaced by ``***``."""
    shown = masked(config)
    for key, value in config.items():
        if shown[key] == "***" and str(value):
            text = text.replace(str(value), "***")
    return text


@dataclass(frozen=True)
class ClusterDefaults:
    """What a cluster applies to a topic created without settings of its own."""

    brokers: int
    replication_factor: int  # default.replication.factor
    min_insync_replicas: int  # min.insync.replicas


@dataclass(frozen=True)
class KafkaConnection:
    """Where a Kafka cluster is and how to talk to it.

    ``config`` holds extra librdkafka settings (security, timeouts...); values of
    secret settings (``sasl.password``, ``ssl.key.password``...) are never shown.
    """

    bootstrap: str
    config: Mapping[str, Any] = field(default_factory=dict, repr=False)
    # Seconds that queries and reads retry transient errors before they give up (retrying).
    retry_s: float = field(default=RETRY_S, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bootstrap", parse_bootstrap(self.bootstrap))
        if (
            isinstance(self.retry_s, bool)
            or not isinstance(self.retry_s, (int, float))
            or not 0 <= self.retry_s <= 3600
        ):
            raise ConfigError(
                f"the Kafka retry deadline must be a number of seconds in [0, 3600], "
                f"got {self.retry_s!r}"
            )
        object.__setattr__(self, "retry_s", float(self.retry_s))
        if "bootstrap.servers" in self.config:
            raise ConfigError("pass the brokers as bootstrap_servers, not in the client config")
        object.__setattr__(self, "config", dict(self.config))

    def __repr__(self) -> str:
        extra = f", config={masked(self.config)}" if self.config else ""
        return f"KafkaConnection({self.bootstrap!r}{extra})"

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """The librdkafka configuration: bootstrap + extra settings + ``overrides``.

        Keyword names use ``_`` for ``.`` (``enable_idempotence=True``).
        """
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            # librdkafka's own log lines go to Python logging, not raw to stderr.
            "logger": _RDKAFKA_LOG,
            **self.config,
        }
        conf.update({k.replace("_", "."): v for k, v in overrides.items()})
        return conf

    def transactional_config(
        self, transactional_id: str, transaction_timeout_ms: int, **overrides: Any
    ) -> dict[str, Any]:
        """A transactional producer's configuration (idempotent, ``acks=all``).

        It connects to every broker it learns of at once (``enable.sparse.connections=false``,
        unless the extra settings choose otherwise). With librdkafka's default sparse
        connections, the bootstrap connection is dropped once the metadata names the
        brokers, and nothing connects to the coordinator until a 500 ms timer fires:
        ``init_transactions`` took about 0.5 s in 4 calls of 10 on this machine, and 5 to 10 ms
        in every call with this setting.
        """
        conf = self.client_config(
            transactional_id=transactional_id,
            transaction_timeout_ms=transaction_timeout_ms,
            enable_idempotence=True,
            acks="all",
            **overrides,
        )
        if "enable.sparse.connections" not in self.config:
            conf["enable.sparse.connections"] = False
        return conf

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.client_config())

    def unavailable(
        self, what: str, exc: BaseException | None = None, kind: str | None = None
    ) -> KafkaUnavailableError:
        """The error for a cluster that could not serve ``what``; ``exc``'s text has secrets
        masked. ``kind`` (default: :func:`classify` of ``exc``, else :data:`NO_ANSWER`) picks
        the message: no broker answered, the leader moved, or a transaction is still open."""
        kind = kind or (classify(exc) if exc is not None else None) or NO_ANSWER
        detail = f": {scrub(str(exc), self.config)}" if exc is not None else ""
        at = f"Kafka at bootstrap servers {self.bootstrap}"
        if kind == LEADER_MOVED:
            text = (
                f"{at} answered, but the leader moved and no broker served it while "
                f"{what}{detail}. The cluster is electing a new leader or coordinator (a "
                "broker was lost or is restarting): check that the brokers are running and "
                "that each partition keeps min.insync.replicas replicas in sync."
            )
        elif kind == TOPIC_NOT_YET_KNOWN:
            text = (
                f"{at} answered, but a broker does not know the topic yet while {what}"
                f"{detail}. A topic just created reaches every broker within seconds; if it "
                "was deleted meanwhile, create it again."
            )
        elif kind == TRANSACTION_OPEN:
            text = (
                f"{at} answered, but a transaction is still open while {what}{detail}: "
                "read_committed readers cannot read past it until its producer commits or "
                "aborts it, or its coordinator aborts it once transaction.timeout.ms has "
                "passed."
            )
        else:
            text = (
                f"{at} did not answer while {what}{detail}. Check the address and that the "
                "brokers are running and reachable from this host."
            )
        error = KafkaUnavailableError(text)
        error.kind = kind
        return error

    def retrying(self, what: str, call: Callable[[], _T], deadline_s: float | None = None) -> _T:
        """``call()``, called again while it raises a transient :class:`KafkaUnavailableError`
        (no broker answered, the leader moved), until ``deadline_s`` (default: this
        connection's ``retry_s``) seconds have passed; then that error, saying how long it
        tried. Anything else is raised at once."""
        deadline_s = self.retry_s if deadline_s is None else deadline_s
        started = time.monotonic()
        wait = 0.1
        while True:
            try:
                return call()
            except KafkaUnavailableError as exc:
                elapsed = time.monotonic() - started
                if exc.kind not in TRANSIENT or elapsed >= deadline_s:
                    if elapsed < 1:
                        raise
                    error = KafkaUnavailableError(
                        f"{exc} (still so after retrying {what} for {elapsed:.0f} s; the retry "
                        "deadline is KafkaSource/KafkaSink retry_timeout=)"
                    )
                    error.kind = exc.kind
                    raise error from None
                _log.info("retrying %s in %.1f s: %s", what, wait, exc)
                time.sleep(min(wait, deadline_s - elapsed))
                wait = min(wait * 2, 2.0)

    def topics(self, timeout: float = TIMEOUT_S) -> dict[str, int]:
        """Every topic of the cluster and its partition count."""
        from confluent_kafka import KafkaException

        try:
            meta = self.admin().list_topics(timeout=timeout)
        except KafkaException as exc:
            raise self.unavailable("listing topics", exc) from None
        return {
            name: len(t.partitions)
            for name, t in meta.topics.items()
            if t.error is None and not name.startswith("__")
        }

    def partitions(self, topic: str, timeout: float = TIMEOUT_S) -> int:
        """The partition count of ``topic``; TopicNotFoundError if it does not exist."""
        known = self.topics(timeout)
        if topic not in known:
            names = ", ".join(sorted(known)[:10]) or "none"
            raise TopicNotFoundError(
                f"Kafka topic {topic!r} does not exist at {self.bootstrap} (topics: {names}). "
                f"Create it first, e.g. `sparkonce kafka create {self.bootstrap} {topic} "
                "--partitions N`."
            )
        return known[topic]

    def cluster_defaults(self, timeout: float = TIMEOUT_S) -> ClusterDefaults:
        """The broker count and the topic defaults the cluster applies (one broker's config:
        ``default.replication.factor``, ``min.insync.replicas``)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import ConfigResource

        admin = self.admin()  # keep a reference: a collected client cancels its futures
        try:
            meta = admin.list_topics(timeout=timeout)
            broker = ConfigResource(ConfigResource.Type.BROKER, str(min(meta.brokers)))
            entries = admin.describe_configs([broker])[broker].result(timeout=timeout)
        except (KafkaException, ValueError) as exc:
            raise self.unavailable("reading the cluster's topic defaults", exc) from None

        def number(name: str) -> int:
            entry = entries.get(name)
            return int(entry.value) if entry is not None and entry.value else 1

        return ClusterDefaults(
            len(meta.brokers), number("default.replication.factor"), number("min.insync.replicas")
        )

    def replication(self, topic: str, timeout: float = TIMEOUT_S) -> tuple[int, int]:
        """(replica count, ``min.insync.replicas``) of an existing ``topic``. A broker that
        does not know it yet raises :data:`TOPIC_NOT_YET_KNOWN` (transient)."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import ConfigResource

        admin = self.admin()  # keep a reference: a collected client cancels its futures
        what = f"reading the replication of topic {topic!r}"
        try:
            meta = admin.list_topics(topic=topic, timeout=timeout).topics[topic]
            if meta.error is not None and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise self.unavailable(what, KafkaException(meta.error), TOPIC_NOT_YET_KNOWN)
            resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
            entries = admin.describe_configs([resource])[resource].result(timeout=timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            unknown = getattr(err, "code", lambda: None)() == KafkaError.UNKNOWN_TOPIC_OR_PART
            raise self.unavailable(what, exc, TOPIC_NOT_YET_KNOWN if unknown else None) from None
        except KeyError as exc:
            raise self.unavailable(what, exc) from None
        replicas = min((len(p.replicas) for p in meta.partitions.values()), default=0)
        entry = entries.get("min.insync.replicas")
        return replicas, int(entry.value) if entry is not None and entry.value else 1

    def ensure_topic(
        self,
        topic: str,
        partitions: int,
        *,
        replication_factor: int | None = None,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> bool:
        """Create ``topic`` unless it exists; True if this call created it.

        Its replication factor is ``replication_factor``, or else the cluster's
        ``default.replication.factor`` (the broker applies it).
        """
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic

        if partitions < 1:
            raise ConfigError(f"topic {topic!r}: partitions must be >= 1, got {partitions}")
        if replication_factor is not None and not is_count(replication_factor):
            raise ConfigError(
                f"topic {topic!r}: replication_factor must be an integer >= 1 (or None for "
                f"the cluster's default.replication.factor), got {replication_factor!r}"
            )
        if topic in self.topics():
            return False
        admin = self.admin()  # keep a reference: a collected client cancels its futures
        futures = admin.create_topics(
            [NewTopic(topic, partitions, replication_factor or -1, config=dict(config or {}))],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        try:
            futures[topic].result(timeout=timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = getattr(err, "code", lambda: None)()
            if code == KafkaError.TOPIC_ALREADY_EXISTS:
                return False
            if code in (KafkaError.INVALID_REPLICATION_FACTOR, KafkaError.INVALID_CONFIG):
                raise ConfigError(
                    f"Kafka at {self.bootstrap} refused to create topic {topic!r}: "
                    f"{scrub(str(exc), self.config)}. Choose a replication factor no larger "
                    "than the number of brokers (--replication-factor / replication_factor=)"
                ) from None
            raise self.unavailable(f"creating topic {topic!r}", exc) from None
        self._wait_for_topic(topic, timeout)
        return True

    def delete_topic(self, topic: str, *, timeout: float = 30.0) -> bool:
        """Delete ``topic`` and wait until the cluster no longer lists it; True if this call
        deleted it, False if there was no such topic. Its records are gone for good."""
        import time

        from confluent_kafka import KafkaError, KafkaException

        admin = self.admin()  # keep a reference: a collected client cancels its futures
        futures = admin.delete_topics([topic], operation_timeout=timeout, request_timeout=timeout)
        try:
            futures[topic].result(timeout=timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if getattr(err, "code", lambda: None)() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return False
            raise self.unavailable(f"deleting topic {topic!r}", exc) from None
        deadline = time.monotonic() + timeout
        while topic in self.topics(timeout=min(TIMEOUT_S, timeout)):
            if time.monotonic() > deadline:
                raise self.unavailable(f"waiting for deleted topic {topic!r} to disappear")
            time.sleep(0.2)
        return True

    def _wait_for_topic(self, topic: str, timeout: float) -> None:
        import time

        from confluent_kafka import KafkaException

        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                meta = self.admin().list_topics(topic=topic, timeout=min(TIMEOUT_S, left))
                t = meta.topics.get(topic)
            except KafkaException:
                t = None  # no answer within what was left; the loop ends at the deadline
            if (
                t is not None
                and t.error is None
                and t.partitions
                and all(p.leader >= 0 for p in t.partitions.values())
            ):
                return
            time.sleep(0.2)
        raise self.unavailable(f"waiting for new topic {topic!r} to get partition leaders")
