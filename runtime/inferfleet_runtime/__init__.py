"""inferfleet serving runtime: paged and compiled engines behind one OpenAI-compatible server."""
