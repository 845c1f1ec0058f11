"""Benchmarks: `inferfleet-runtime bench serve` (an online client for any OpenAI-compatible server) and offline.py."""
