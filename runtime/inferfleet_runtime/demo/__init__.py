"""The demo models: the built-in tiny Llama trained on the Zen of Python, and the real SmolLM2-135M-Instruct."""
