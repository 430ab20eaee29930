"""Kafka client configuration shared by the gateway, the agents and ``ptel``: where the brokers are and how to
authenticate (:mod:`kafka_settings.connection`). Client settings, not a schema: no wire or spec type lives here."""
