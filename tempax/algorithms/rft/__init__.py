"""Rejection-sampling fine-tuning (RFT / STaR / ReST-EM / expert iteration) on the shared RL layer (`tempax.rl`):
sample k completions per problem with the current policy, keep those the checker accepts (deduplicated, capped
per problem), fine-tune on them with the SFT loss, repeat.

    selection.py  pure: accept / dedup / cap masks and per-completion loss weights
    losses.py     pure: the weighted SFT loss
    config.py     RFTConfig (recipe) and RFTKnobsConfig (the algorithm knobs)
    source.py     rounds of the current policy's accepted samples as a batch source for Trainer.fit (RFTSource)
    main.py       make_rft_loss and main(RFTConfig): `tempax rft --config RECIPE.yaml`

Nothing heavy is imported here (the registry reads `ALGORITHMS`); import the pieces from their modules.
"""

from tempax.algorithms.registry import Algorithm

ALGORITHMS = (
    Algorithm("rft", "rejection-sampling fine-tuning (RFT / STaR / ReST-EM) with a checker from a recipe",
              config="tempax.algorithms.rft.config:RFTConfig", main="tempax.algorithms.rft.main:main",
              card="Rejection-sampling fine-tuning (STaR, Zelikman et al. 2022; ReST-EM, Singh et al. 2023): "
                   "completions sampled from the current policy, those a checker accepts kept, and the model "
                   "fine-tuned on them with the SFT loss, round after round.",
              on_policy=True, knobs=("rft",), renders_chat=True, reference_curve="rft", listing=40),
)
