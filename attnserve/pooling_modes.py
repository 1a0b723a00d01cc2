"""sentence-transformers' Pooling modes: the names that a checkpoint's Pooling config, the exported graph's pooling
(model/pooling.py, in torch) and request-time pooling (engine/pooling.py, in numpy) share. Here, below both, so
that the model and the engine name them without importing each other."""

# In the order sentence-transformers concatenates them (and names them in configs).
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")

# In the attention mask of a graph whose pipeline leaves the prompt out of the pooling (include_prompt false): a
# prompt token, attended to as a real token (1) is, but not pooled (model/sentence_head.py; engine/engine.py marks it).
PROMPT_TOKEN = 2
