"""Supervised fine-tuning and continued pre-training: next-token cross-entropy on the shared training core.

    losses.py   pure math: `causal_lm_loss` (the fused, chunked form is `tempax.ops.fused_head`)
    main.py     SFTConfig / PretrainConfig and main: `tempax sft|pretrain --config RECIPE.yaml`

Distillation is `tempax.algorithms.distill`. Nothing heavy is imported here (the registry reads `ALGORITHMS`).
"""

from tempax.algorithms.registry import Algorithm

ALGORITHMS = (
    Algorithm("sft", "supervised fine-tuning (full, LoRA, QLoRA) from a recipe",
              config="tempax.algorithms.sft.main:SFTConfig", main="tempax.algorithms.sft.main:main",
              knobs=("loss",), reference_curve="sft"),
    Algorithm("pretrain", "continued pre-training on plain text from a recipe",
              config="tempax.algorithms.sft.main:PretrainConfig", main="tempax.algorithms.sft.main:main",
              knobs=("loss",), reference_curve="pretrain"),
)
