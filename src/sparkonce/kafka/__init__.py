"""Kafka plumbing shared by the Kafka source, sink and producer (confluent-kafka)."""

from sparkonce.kafka.client import KafkaConnection, KafkaUnavailableError, masked, parse_bootstrap

__all__ = ["KafkaConnection", "KafkaUnavailableError", "masked", "parse_bootstrap"]
