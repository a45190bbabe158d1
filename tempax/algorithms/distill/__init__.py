"""Knowledge distillation: logit KD (forward/reverse KL, generalised JSD at temperature T, top-k teacher),
sequence-level KD and on-policy GKD, from a frozen teacher into a student that may be a layer-pruned copy of it.

    losses.py    pure math: `distillation_loss`, `chunked_distillation_loss`, `token_divergence`
    models.py    the student/teacher pair, the pruned student, teacher storage
    sequence.py  teacher generations for sequence-level KD
    gkd.py       the on-policy (GKD) batch source
    main.py      DistillConfig and main: `tempax distill --config RECIPE.yaml`

Nothing heavy is imported here (the registry reads `ALGORITHMS`).
"""

from tempax.algorithms.registry import Algorithm, RunModel

ALGORITHMS = (
    Algorithm("distill", "knowledge distillation of a teacher into a (layer-pruned) student from a recipe",
              config="tempax.algorithms.distill.main:DistillConfig",
              main="tempax.algorithms.distill.main:main",
              card="Knowledge distillation (Hinton et al. 2015; on-policy GKD, Agarwal et al. 2024): a student "
                   "trained to match a frozen teacher's token distributions (forward or reverse KL, generalised "
                   "JSD) on the data, on teacher generations or on its own samples.",
              knobs=("mode", "loss", "sequence", "on_policy"), reference_curve="distill", listing=60,
              models=("teacher", "student"),
              model=RunModel("folder", "student", note="a distillation run writes its student there when it "
                             "finishes (save_student: true)")),
)
