"""The HTTP collection gateway: devices that cannot speak Kafka send their privatized reports here.

A device privatizes on its own side (:mod:`producers`) and POSTs the encoded report (the binary or JSON wire format
of :mod:`schemas.wire`) with its device token. The gateway authenticates the device (:mod:`gateway.device_auth`),
checks the report against the spec (:mod:`schemas.conformance`), replaces the pseudonym the device claimed by one
derived from the authenticated identity (:mod:`gateway.keys`), holds each device to the spec's contribution bounds
(:mod:`gateway.device_quota`), packs the reports of many devices into columnar batches and publishes them with
the idempotent producer (:mod:`gateway.forwarder`), and answers 202 only once Kafka has acknowledged them
(:mod:`gateway.server`). ``docs/gateway.md`` describes the HTTP API; :mod:`gateway.openapi` is its OpenAPI document.
"""
