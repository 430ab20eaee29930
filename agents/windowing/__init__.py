"""Time on the data path: event-time windows (:mod:`.windows`) and the watermarks and release frontier that close
them (:mod:`.watermarks`), shared by stage 1 and stage 2."""
