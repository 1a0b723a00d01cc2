"""attnserve: contextualized embeddings and attention maps, served."""

__version__ = "0.3.0"
