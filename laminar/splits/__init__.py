"""Key-range partitioning: partitions that split and merge, with lineage.

``ranges.py`` is the range map (pure functions over the key-hash space), ``ops.py`` the
begin/finish metadata commands, ``seal.py`` the seal control batch a parent partition's own Raft
log carries, ``driver.py`` the split driver's decisions and ``auto.py`` the automatic policy's
(both sans-I/O), ``service.py`` the node side (sealing on a partition leader; driving open
operations and sampling load on the metadata leader) and ``wire.py`` the protocol fields.
"""
