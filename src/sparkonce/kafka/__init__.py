"""Kafka plumbing shared by the Kafka source, sink and producer (confluent-kafka).

``KafkaUnavailableError`` is defined in :mod:`sparkonce.errors`; it is importable from
here too, as it was before it joined the error hierarchy.
"""

from sparkonce.errors import KafkaUnavailableError
from sparkonce.kafka.client import KafkaConnection, masked, parse_bootstrap
from sparkonce.kafka.consumer import KafkaReader, new_consumer
from sparkonce.kafka.producer import (
    RECORD_ID_HEADER,
    DeliveryFailure,
    KafkaDeliveryError,
    KafkaProducer,
)

__all__ = [
    "RECORD_ID_HEADER",
    "DeliveryFailure",
    "KafkaConnection",
    "KafkaDeliveryError",
    "KafkaProducer",
    "KafkaReader",
    "KafkaUnavailableError",
    "masked",
    "new_consumer",
    "parse_bootstrap",
]
