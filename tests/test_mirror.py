"""tests/ mirrors tempax/: every module with logic (a function or a class) has a namesake test file, or is listed
in `TESTED_ELSEWHERE` with the test files that cover it and why they are not its namesake.

The namesake of `tempax/x/y.py` is `tests/x/test_y.py`; of a package's `tempax/x/__init__.py`, `tests/x/test_x.py`;
of `tempax/__init__.py`, `tests/test_package.py`. The files are read with `ast` (nothing is imported). A listed
module that gains its namesake fails the test until it leaves the list, so the list only shrinks.
"""

from __future__ import annotations

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Module (path under the repository) -> the test files that cover it and why none is its namesake. A reason names
# at least one test file that exists.
TESTED_ELSEWHERE: dict[str, str] = {
    # -- algorithms: an algorithm's parts are tested through its main and source, as a run uses them together
    "tempax/algorithms/common.py": "ModelSourceConfig and building a model with its adapters: every command's "
                                   "recipe builds through it in tests/algorithms/test_registry.py and "
                                   "tests/test_recipes.py",
    "tempax/algorithms/distill/gkd.py": "the on-policy source (batches on-policy with probability lambda, "
                                        "reproducibly; training on the student's samples): "
                                        "tests/algorithms/distill/test_main.py",
    "tempax/algorithms/distill/models.py": "StudentTeacher, the pruned-copy student, the teacher's storage and the "
                                           "vocabulary check: tests/algorithms/distill/test_main.py",
    "tempax/algorithms/distill/sequence.py": "sequence-level distillation's generated dataset: "
                                             "tests/algorithms/distill/test_main.py",
    "tempax/algorithms/episode_eval.py": "greedy episodes scored as one-turn completions: the GRPO environment runs of "
                                         "tests/algorithms/grpo/test_episodes.py and the tool demo's five stages in "
                                         "tests/experiments/test_tool_demo.py evaluate through it",
    "tempax/algorithms/grpo/config.py": "every GRPO setting's check: tests/algorithms/grpo/test_objective.py, "
                                        "test_source.py and test_estimators.py parse and refuse through it",
    "tempax/algorithms/grpo/main.py": "GRPO's run, end to end on a tiny model: tests/algorithms/grpo/test_objective.py "
                                      "and tests/algorithms/grpo/test_episodes.py",
    "tempax/algorithms/grpo/plan.py": "the plan every GRPO source is built from: tests/algorithms/grpo/test_source.py "
                                      "and tests/algorithms/grpo/test_episodes.py",
    "tempax/algorithms/grpo/recommend.py": "one decision of the recommendation procedure, tested with the others in "
                                           "tests/algorithms/test_recommend.py",
    "tempax/algorithms/ppo/config.py": "PPO's settings and their checks: tests/algorithms/ppo/test_source.py",
    "tempax/algorithms/ppo/main.py": "PPO's run on a tiny model (value head, GAE, resume): "
                                     "tests/algorithms/ppo/test_source.py",
    "tempax/algorithms/ppo/model.py": "ActorCritic: tests/algorithms/ppo/test_source.py trains the policy and its "
                                      "value head together and checks both get gradients",
    "tempax/algorithms/preference/batches.py": "pair log-probs and stored reference log-probs: "
                                               "tests/algorithms/preference/test_dpo.py and test_kto.py",
    "tempax/algorithms/preference/data.py": "the preference data section: tests/algorithms/preference/test_dpo.py, "
                                            "test_kto.py and test_reward_model.py read their recipes through it",
    "tempax/algorithms/preference/recommend.py": "one decision of the recommendation procedure, tested with the "
                                                 "others in tests/algorithms/test_recommend.py",
    "tempax/algorithms/preference/reward.py": "reward-model training: tests/algorithms/preference/test_reward_model.py",
    "tempax/algorithms/rft/config.py": "RFT's settings: tests/algorithms/rft/test_source.py and "
                                       "tests/algorithms/rft/test_selection.py",
    "tempax/algorithms/rft/losses.py": "the weighted SFT loss of kept completions: tests/algorithms/rft/test_source.py "
                                       "and tests/algorithms/rft/test_selection.py",
    "tempax/algorithms/rft/main.py": "RFT's run on a tiny model: tests/algorithms/rft/test_source.py",
    "tempax/algorithms/run.py": "the steps every main shares (start, build, train, finish, RunResult): every "
                                "command runs through them in tests/cli/test_train_cmds.py, and "
                                "tests/algorithms/test_registry.py checks each main returns a RunResult",
    "tempax/algorithms/sft/checks.py": "SFT's validate hook: tests/algorithms/test_validate.py (rows in no format, a "
                                       "tokenizer without a chat template)",
    "tempax/algorithms/sft/recommend.py": "one decision of the recommendation procedure, tested with the others in "
                                          "tests/algorithms/test_recommend.py",
    # -- the CLI: a command module only parses and prints; its tests run the command as a user does
    "tempax/cli/chat.py": "`tempax chat` is run with scripted input in tests/cli/test_generate.py",
    "tempax/cli/export.py": "`tempax export` is run in tests/cli/test_export_card.py, test_export_damaged.py and "
                            "test_export_overwrite.py",
    "tempax/cli/flags.py": "flag names in messages: tests/cli/test_messages.py",
    "tempax/cli/plot.py": "`tempax plot` is run in tests/cli/test_train_cmds.py",
    # -- data
    "tempax/data/kinds.py": "what kind of row a dataset holds: cleaning reads rows through it in "
                            "tests/data/test_clean.py",
    "tempax/data/report.py": "the kept / skipped / dropped report: tests/data/test_reasons.py and "
                             "tests/data/test_formats.py",
    "tempax/data/tasks/arithmetic.py": "the generated problems: tests/data/test_tasks.py",
    "tempax/data/tasks/code.py": "the generated code problems: tests/data/test_code_task.py",
    "tempax/data/tasks/common.py": "prompts and targets shared by the tasks: tests/data/test_tasks.py",
    "tempax/data/tasks/gsm8k.py": "GSM8K rows from a folder or the Hub: tests/data/test_tasks.py",
    "tempax/data/tasks/spec.py": "TaskConfig and load_task: tests/data/test_tasks.py and tests/data/test_code_task.py",
    # -- experiments: the demos' parts run together in the demos' tests
    "tempax/experiments/plots.py": "the reward curve and the metric plots: tests/experiments/test_demo.py (the "
                                   "demo's reward_curve.png) and `tempax plot` in tests/cli/test_train_cmds.py",
    "tempax/experiments/stages.py": "the algorithm runs on the model in memory: the demos' end-to-end runs in "
                                    "tests/experiments/test_demo.py and tests/experiments/test_tool_demo.py",
    # -- export, generate
    "tempax/export/model_info.py": "`tempax model-info` prints these facts in tests/cli/test_model_info.py",
    "tempax/generate/engine.py": "the decode engine under every generation: tests/generate/test_generate.py (greedy "
                                 "parity, sampling, stops, batching invariance), test_multi_turn.py and "
                                 "test_program_store.py",
    "tempax/generate/generation.py": "`generate` and its request splitting: tests/generate/test_generate.py",
    # -- models
    "tempax/models/cache.py": "the KV cache: cached against uncached decoding in tests/models/test_decoder.py and "
                              "tests/generate/test_generate.py",
    "tempax/models/gguf_io.py": "reading GGUF files: tests/models/test_gguf.py and "
                                "tests/models/test_gguf_dequantize.py",
    "tempax/models/hf_io.py": "Hugging Face folders in and out: tests/models/test_roundtrip.py and "
                              "tests/models/test_parity.py",
    "tempax/models/init.py": "initialisation under a mesh: tests/parallel/test_reshape_and_init.py",
    "tempax/models/quant.py": "QLoRA's quantised kernels: tests/models/test_qlora.py",
    "tempax/models/reward_model.py": "the scalar-head model: tests/algorithms/preference/test_reward_model.py and "
                                     "tests/eval/test_scoring.py",
    # -- parallel
    "tempax/parallel/peers.py": "a lost process named in one line: tests/parallel/test_two_hosts.py",
    "tempax/parallel/process.py": "whose rows and host copies: tests/parallel/test_reshape_and_init.py (process_rows, "
                                  "host_array), and who writes in the two-process runs of "
                                  "tests/parallel/test_multiprocess.py",
    "tempax/parallel/rules.py": "the logical-axis table: tests/parallel/test_sharding.py",
    # -- rewards
    "tempax/rewards/registry.py": "the reward names of a recipe: tests/rewards/test_code.py and "
                                  "tests/envs/test_environment.py",
    "tempax/rewards/reward_model.py": "a trained reward model as a reward: "
                                      "tests/algorithms/preference/test_reward_model.py",
    "tempax/rewards/sandbox_launcher.py": "the launcher runs as the sandbox's child process, so its behaviour is "
                                          "seen through the attacks of tests/rewards/test_sandbox.py",
    # -- rl
    "tempax/rl/logprobs.py": "the training forward's log-probs: tests/rl/test_episodes.py and "
                             "tests/algorithms/grpo/test_objective.py",
    # -- serve
    "tempax/serve/__init__.py": "the server: tests/serve/test_server.py",
    "tempax/serve/protocol.py": "the OpenAI wire format: tests/serve/test_server.py",
    # -- train
    "tempax/train/config.py": "the training settings: tests/train/test_loop.py, test_step.py and test_optim.py",
    "tempax/train/state.py": "the trainable / frozen split: tests/train/test_checkpoint.py and "
                             "tests/train/test_loop.py",
}


def namesake(module_path: str) -> str:
    """The test file of a module path under the repository (see the module docstring)."""
    parts = module_path.split("/")[1:]  # without "tempax"
    if parts == ["__init__.py"]:
        return "tests/test_package.py"
    if parts[-1] == "__init__.py":
        return "/".join(["tests", *parts[:-1], f"test_{parts[-2]}.py"])
    return "/".join(["tests", *parts[:-1], f"test_{parts[-1]}"])


def modules_with_logic() -> list[str]:
    """Every module under tempax/ that defines a function or a class at its top level, as a repository path."""
    found = []
    for folder, _, files in os.walk(os.path.join(REPO, "tempax")):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            if any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in tree.body):
                found.append(os.path.relpath(path, REPO).replace(os.sep, "/"))
    return sorted(found)


def test_namesake_paths():
    assert namesake("tempax/rl/rollout.py") == "tests/rl/test_rollout.py"
    assert namesake("tempax/configlib/build.py") == "tests/configlib/test_build.py"
    assert namesake("tempax/serve/__init__.py") == "tests/serve/test_serve.py"
    assert namesake("tempax/__init__.py") == "tests/test_package.py"


def test_every_module_with_logic_has_its_test_file_or_a_reason():
    missing = [m for m in modules_with_logic()
               if not os.path.exists(os.path.join(REPO, namesake(m))) and m not in TESTED_ELSEWHERE]
    assert not missing, ("modules without a namesake test file (add it, or list the module in TESTED_ELSEWHERE with "
                         "the tests that cover it):\n" + "\n".join(f"  {m} -> {namesake(m)}" for m in missing))


def test_the_list_only_names_modules_without_a_namesake_and_existing_tests():
    """An entry whose module gained its namesake, or is gone, leaves the list; every reason names a test file that
    exists."""
    modules = set(modules_with_logic())
    stale = [m for m in TESTED_ELSEWHERE if m not in modules or os.path.exists(os.path.join(REPO, namesake(m)))]
    assert not stale, "no longer needed in TESTED_ELSEWHERE (delete the entries):\n" + "\n".join(stale)
    for module, reason in TESTED_ELSEWHERE.items():
        named = [word.strip(",;:()") for word in reason.split() if word.strip(",;:()").endswith(".py")]
        folder = os.path.dirname(next((w for w in named if w.startswith("tests/")), "tests/x"))
        paths = [w if w.startswith("tests/") else os.path.join(folder, w) for w in named]
        assert paths, f"{module}: the reason names no test file"
        absent = [p for p in paths if not os.path.exists(os.path.join(REPO, p))]
        assert not absent, f"{module}: the reason names test files that do not exist: {absent}"
