"""The embedded durable log: the default replayable source when there is no Kafka."""

from sparkonce.log.producer import IdempotentProducer, partition_for_key
from sparkonce.log.storage import AppendResult, NewRecord, Record, Topic, list_topics

__all__ = [
    "AppendResult",
    "IdempotentProducer",
    "NewRecord",
    "Record",
    "Topic",
    "list_topics",
    "partition_for_key",
]
