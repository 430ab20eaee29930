"""Stage 1, in the order a source record walks it: :mod:`.validation` (decode and check against the spec),
:mod:`.columns` (the columnar decode of a batch), :mod:`.batch_layout` (the batch cut into runs per window),
:mod:`.placement` (which partition a report belongs on), :mod:`.aggregator` (the per-kind counting into partials),
:mod:`.partition_state` (one source partition's open windows and watermark) and :mod:`.records` (what stage 1
writes: partials, handovers to stage 2, dead letters)."""
