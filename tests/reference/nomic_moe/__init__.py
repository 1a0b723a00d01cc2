"""nomic-embed-text-v2-moe's published modelling code (modeling_hf_nomic_bert.py's header)."""
