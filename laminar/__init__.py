"""laminar: a distributed, partitioned, Raft-replicated, immutable log."""
