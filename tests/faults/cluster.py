"""The fault suite's 3-node KRaft cluster: :mod:`testbed.cluster` (shared with the production-shape rig and
``bench/failover_stall.py``)."""

from testbed.cluster import CLUSTER_SETTINGS, NODES, Cluster, ClusterNode

__all__ = ["CLUSTER_SETTINGS", "NODES", "Cluster", "ClusterNode"]
