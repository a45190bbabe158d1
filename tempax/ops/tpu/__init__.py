"""TPU variants of tempax's ops, built on the Pallas TPU kernels JAX ships (`jax.experimental.pallas.ops.tpu`).

* `attention`: training and prefill attention on splash attention (block-sparse flash attention) with tempax's
  causal, segment and sliding-window masks, grouped query heads and Gemma 2's soft-cap.
* `decode`: one query token per row over the KV cache on JAX's paged attention kernel, reading tempax's
  [B, K, S, H] cache in place.
* `experts`: the mixture-of-experts grouped products on megablox's grouped matmul.

Each module says which arguments its kernel takes (`supports` / `unsupported_reason`), so the op table in
`tempax.ops` can fall back to the plain op for anything else, and what the kernel returns where it differs from
`tempax.ops.plain` (positions no key is visible to). On a CPU the kernels run in Pallas's interpret mode
(`interpret=True`), which is how the tests compare them with the plain ops.
"""
