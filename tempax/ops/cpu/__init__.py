"""XLA:CPU's variants of tempax's ops: the same functions as `tempax.ops.plain`, written in the forms XLA:CPU
(jaxlib 0.10) runs fast.

What XLA:CPU rewards, and so what every form here does:

* operands multiplied in the layout they lie in, with no transposing copy of a large array (`matmul`);
* bf16 dots that ask for a float32 result and contract their left operand's minor axis, the only ones that run
  on its bf16 kernels (`matmul`, `attention`);
* few-row products with the weight on the left, and reductions written as one fused multiply-and-sum where a
  dot thunk would stream memory slowly (`attention`'s decode step, `lm_head`);
* optimization barriers where the simplifier would otherwise undo a chosen layout.

`tempax.ops` chooses these on a CPU backend. Each module's docstring states its rule and the reason; the
measurements behind them, with the commands that repeat them, are in `docs/measurements/performance-history.md`.
"""
