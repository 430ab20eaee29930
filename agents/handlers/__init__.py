"""Everything the agents do differently per metric kind: one module per kind holding its handler
(:class:`agents.handlers.base.KindHandler` -- the shape of its counts, the columnar spec check, the contribution
bound and counting, the device measurement, the release) and one table, :data:`agents.handlers.registry.HANDLERS`.

Stage 1 (:mod:`agents.stage1.aggregator`, :mod:`agents.stage1.partition_state`) and stage 2
(:mod:`agents.stage2.release`) look a metric's handler up by its :data:`schemas.kinds.MetricKind` once per table, group
or window -- never per record -- and name no kind themselves.
"""
