"""Shipped assets (each with a PROVENANCE note)."""
