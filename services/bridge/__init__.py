"""Data bridges: MQTT messages out to Kafka (`[[bridge.kafka_out]]`, docs/bridges.md)."""
