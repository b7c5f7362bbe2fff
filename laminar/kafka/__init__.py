"""Kafka's wire protocol on a laminar node (see docs/ARCHITECTURE.md, "The Kafka listener")."""
