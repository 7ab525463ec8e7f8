"""Helpers for testing tidemark applications: a private PostgreSQL cluster and more."""
