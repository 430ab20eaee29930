"""The worker's runtime: :mod:`.composition` builds a worker from a spec (the composition root), :mod:`.worker`
runs the consume-count-release loop with :mod:`.stage1_pipeline`, and :mod:`.observability` with
:mod:`.http_surface` serves health and metrics."""
