"""tempax: post-training for large language models in JAX."""

__version__ = "0.1.0"
