"""Talking to the Kubernetes API: the client, credentials, and what counts as a change."""
