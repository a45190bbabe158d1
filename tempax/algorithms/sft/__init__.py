"""Supervised fine-tuning and continued pre-training: next-token cross-entropy on the shared training core.

    losses.py   pure math: `causal_lm_loss` (the fused, chunked form is `tempax.ops.fused_head`)
    main.py     SFTConfig / PretrainConfig and main: `tempax sft|pretrain --config RECIPE.yaml`
    checks.py   `tempax validate`'s SFT checks: rows in a format SFT reads, a chat template for chat rows

Distillation is `tempax.algorithms.distill`. Nothing heavy is imported here (the registry reads `ALGORITHMS`).
"""

from tempax.algorithms.registry import Algorithm

ALGORITHMS = (
    Algorithm("sft", "supervised fine-tuning (full, LoRA, QLoRA) from a recipe",
              config="tempax.algorithms.sft.main:SFTConfig", main="tempax.algorithms.sft.main:main",
              card="Supervised fine-tuning: next-token cross-entropy on the demonstrations' target tokens (the "
                   "assistant turns of chats, the completions of prompt/completion rows).",
              knobs=("loss",), reference_curve="sft", recommend="tempax.algorithms.sft.recommend:SFT",
              validate="tempax.algorithms.sft.checks:check_rows", listing=10),
    Algorithm("pretrain", "continued pre-training on plain text from a recipe",
              config="tempax.algorithms.sft.main:PretrainConfig", main="tempax.algorithms.sft.main:main",
              card="Continued pre-training: next-token cross-entropy on every token of plain-text documents, "
                   "packed into rows, long ones split.",
              knobs=("loss",), reference_curve="pretrain", recommend="tempax.algorithms.sft.recommend:PRETRAIN",
              listing=10),
)
