"""Central DP on the server: exact noise samplers, thresholds, the capacity test, quantile and Theil-Sen
(the layout: :mod:`mechanisms`)."""
