"""attnserve: contextualized embeddings and attention maps, served."""

__version__ = "0.2.0"
