"""The API's types and the CRDs generated from them (the lowest layer: imports nothing of the operator above it)."""
