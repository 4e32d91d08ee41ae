"""Kafka plumbing shared by the Kafka source, sink and producer (confluent-kafka)."""

from sparkonce.kafka.client import KafkaConnection, KafkaUnavailableError, masked, parse_bootstrap
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
    "KafkaUnavailableError",
    "masked",
    "parse_bootstrap",
]
