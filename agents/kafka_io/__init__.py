"""Kafka plumbing of the worker: the topics and their configuration (:mod:`.topics`), the changelog and the
transactional producer (:mod:`.changelog`), dead-letter records (:mod:`.dead_letters`) and riding out broker
faults (:mod:`.recovery`)."""
