"""Checkpoint readers: Hugging Face directories, GGUF files, compressed-tensors weights, and the tokenizer."""
