"""Building blocks the model families (models/) are assembled from: norms, rotary tables, linears, attention, MLP."""
