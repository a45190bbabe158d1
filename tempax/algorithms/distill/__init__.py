"""Knowledge distillation: logit KD (forward/reverse KL, generalised JSD at temperature T, top-k teacher) and
sequence-level KD, from a frozen teacher into a student that may be a layer-pruned copy of it.

    from tempax.algorithms.distill import DistillConfig, main
"""

from tempax.algorithms.distill.losses import chunked_distillation_loss, distillation_loss, token_divergence
from tempax.algorithms.distill.trainer import DistillConfig, main, make_distill_loss

__all__ = ["DistillConfig", "chunked_distillation_loss", "distillation_loss", "main", "make_distill_loss",
           "token_divergence"]
