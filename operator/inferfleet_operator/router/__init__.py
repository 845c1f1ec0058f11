"""The embedded router: an OpenAI-compatible reverse proxy that sends each request to the pod the picker chooses."""
