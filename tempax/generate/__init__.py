"""Generation: batched sampling with a KV cache, log-probs for RL, stop strings, streaming.

    from tempax.generate import SamplingConfig, generate
    result = generate(model, tokenizer, prompts, SamplingConfig(n=4, temperature=1.0, max_new_tokens=128))
"""

from tempax.generate.config import SamplingConfig
from tempax.generate.engine import DecodeRun, bucket_length, compile_counts
from tempax.generate.generation import GenerationResult, GenerationStats, generate, stream

__all__ = [
    "DecodeRun",
    "GenerationResult",
    "GenerationStats",
    "SamplingConfig",
    "bucket_length",
    "compile_counts",
    "generate",
    "stream",
]
