"""Retention: the per-tenant host-TTL controllers and their types."""
