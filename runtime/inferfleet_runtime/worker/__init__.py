"""What runs the model for the engine: the paged model runner, the sampler, and the tensor-parallel ranks."""
