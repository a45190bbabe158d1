"""SIGTERM in the middle of a GRPO rollout (while its completions are being scored): the step that rollout feeds
finishes, a checkpoint of it is written (it stores the rollout's pending pass), `fit` raises `RunStopped` (exit
status 143), and the resumed run's losses equal the uninterrupted run's exactly."""

from __future__ import annotations

import os
import signal

import pytest

from tempax.rl.rollout import PromptSampler
from tempax.algorithms.grpo.plan import GRPOPlan
from tempax.algorithms.grpo.source import GRPOSource, grpo_hooks, make_grpo_trainer
from tempax.rewards import combine_rewards
from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
from tempax.train.preemption import RunStopped
from tests.algorithms.grpo.test_objective import model, prompts, tok  # noqa: F401 - the shared tiny fixtures
from tests.algorithms.grpo.test_source import SETTINGS, char_count
from tests.kit.compile_cache import persistent_compile_cache


def _run(model, tok, prompts, run_dir, *, steps, reward):  # noqa: F811
    cfg = TrainConfig(
        steps=steps, batch_size=2, mesh=MeshConfig(num_devices=1), run_dir=str(run_dir), tensorboard=False,
        progress_bar=False, check_memory=False, optimizer=OptimizerConfig(learning_rate=3e-2, schedule="constant"),
        checkpoint=CheckpointConfig(every=0, save_at_end=True, resume=True, async_save=True),
    )
    source = GRPOSource(tok, PromptSampler(prompts, seed=0), combine_rewards({"chars": reward}),
                        GRPOPlan.build(SETTINGS), prompt_len=24)
    trainer = make_grpo_trainer(model, SETTINGS, source.plan, cfg, prompt_len=24, log=lambda s: None)
    try:
        return trainer.fit(source, hooks=list(grpo_hooks(source)))
    finally:
        trainer.close()


@pytest.mark.heavy
def test_sigterm_while_a_rollout_is_scored(model, tok, prompts, tmp_path, survived):  # noqa: F811
    """num_iterations = 2: rollout 1 feeds steps 1-2, rollout 2 steps 3-4. SIGTERM comes while rollout 2 is scored
    (the reward's second call): step 3 runs, is checkpointed, and the run stops; resumed, step 4 equals."""
    calls = []

    def terminating(prompts_, completions, **columns):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return char_count(prompts_, completions, **columns)

    with persistent_compile_cache(tmp_path / "xla-cache"):
        straight = _run(model, tok, prompts, tmp_path / "straight", steps=4, reward=char_count)
        with pytest.raises(RunStopped) as stopped:
            _run(model, tok, prompts, tmp_path / "run", steps=4, reward=terminating)
        assert stopped.value.exit_status == 143 and stopped.value.step == 3
        assert stopped.value.checkpoint.endswith(os.path.join("checkpoints", "3"))
        resumed = _run(model, tok, prompts, tmp_path / "run", steps=4, reward=char_count)
    assert resumed.resumed_from == 3 and resumed.losses == straight.losses[3:]
    survived("SIGTERM", "during a GRPO rollout")
