"""Key-range partitioning: partitions that split and merge, with lineage.

``ranges.py`` is the range map (pure functions over the key-hash space), ``seal.py`` the seal
control batch a parent partition's own Raft log carries, ``plan.py`` the split driver's
decisions (sans-I/O) and ``service.py`` the node side (sealing on a partition leader, driving
open operations on the metadata leader).
"""
