"""sentence-transformers' Pooling modes: the names that a checkpoint's Pooling config, the exported graph's pooling
(model/pooling.py, in torch) and request-time pooling (engine/pooling.py, in numpy) share. Here, below both, so
that the model and the engine name them without importing each other."""

# In the order sentence-transformers concatenates them (and names them in configs).
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
