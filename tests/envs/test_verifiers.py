"""Tasksets written for verifiers 0.4 as tempax environments: the example shop taskset played by scripted replies
(its toolset called in-process, its rewards scored by verifiers after every reply), a tiny model's episodes scored
exactly as verifiers' own `Task.score` scores the same replies, `@vf.stop`s and the shared rollout state, the
refusals that name what in-process play does not support, and 2 GRPO steps on the example's recipe."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import verifiers.v1 as vf
from verifiers.v1.envs.user_sim import UserSimEnv
from verifiers.v1.graph import MessageNode

from tempax.envs.environment import EpisodeLimits, run_episode
from tempax.envs.registry import EnvironmentConfig
from tempax.envs.verifiers import verifiers_factory
from tempax.errors import ConfigError, DataError
from tempax.rl.episodes import play_episodes
from tempax.rl.rollout import encode_prompts
from tests.algorithms.grpo.test_episodes import two_tiny_steps
from tests.algorithms.grpo.test_objective import model, tok  # noqa: F401 - the shared tiny fixtures
from tests.kit.models import tiny_tempax_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "recipes", "grpo_verifiers_shop.yaml")
SHOP = EnvironmentConfig(name="verifiers:examples/verifiers_shop_taskset.py:ShopTaskset", max_turns=4,
                         options={"baskets": 4})


def call(item: str) -> str:
    return f'<tool_call>{{"name": "shop_price_of", "arguments": {{"item": "{item}"}}}}</tool_call>'


def test_a_shop_episode_calls_the_toolset_in_process_and_is_scored_by_the_tasks_rewards(tok, monkeypatch):
    """Basket 0 of seed 0 is rice (180) and tea (260), total 440. Reply 1 looks up rice; its text without the call
    is empty, so verifiers would score the conversation cut there brief 1 x 0.1 = 0.1 and correct 0. Reply 2 asks
    for caviar (the shop's refusal is the answer), an unknown tool (verifiers' chat loop's error text) and one call
    that cannot be read (counted, not answered). Reply 3, "440", is correct (1 x 1.0) and brief, which it already
    was: the parts are the changes, correct 0, 0, 1.0 and brief 0.1, 0, 0, adding up to verifiers' score of the
    whole conversation, correct 1.0 + brief 0.1."""
    monkeypatch.chdir(ROOT)
    env = SHOP.build(tok)()
    replies = iter([call("rice"), call("caviar") + '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
                    "<tool_call>{bad</tool_call>", "440"])
    episode = run_episode(env, {"idx": 0}, lambda messages: next(replies), tokenizer=tok,
                          limits=EpisodeLimits(max_turns=4))
    system, user = episode.messages[:2]
    assert system["content"].startswith("You work at a shop's till.") and '"name": "shop_price_of"' in system["content"]
    assert user == {"role": "user", "content": "What do rice, tea cost together? Look up each price with the shop's "
                                               "price tool, then answer with the total in cents."}
    assert episode.messages[3] == {"role": "tool", "name": "shop_price_of", "content": "180"}
    assert episode.messages[5]["content"].startswith("we do not sell 'caviar'")
    assert episode.messages[6] == {"role": "tool", "name": "nope", "content": "error: unknown tool 'nope'"}
    assert episode.turn_rewards == [{"correct": 0.0, "brief": 0.1}, {"correct": 0.0, "brief": 0.0},
                                    {"correct": 1.0, "brief": 0.0}]
    assert episode.rewards == pytest.approx({"correct": 1.0, "brief": 0.1}) and episode.truncated is None
    assert {k: episode.metrics[k] for k in ("verifiers_tool_calls", "verifiers_tool_errors",
                                            "verifiers_malformed_calls", "verifiers_lookups")} == {
        "verifiers_tool_calls": 3.0, "verifiers_tool_errors": 1.0, "verifiers_malformed_calls": 1.0,
        "verifiers_lookups": 3.0}
    trace = env.trace  # what verifiers recorded: the calls as tool_calls, the results as tool messages
    assert [m.role for m in trace.messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "tool",
                                                "assistant"]
    assert trace.messages[0].content == "You work at a shop's till. Answer with the total in cents, a number only."
    assert [c.name for c in trace.messages[4].tool_calls] == ["shop_price_of", "nope"]
    assert trace.reward == pytest.approx(1.1) and [t.name for t in trace.tools] == ["shop_price_of"]


class LetterData(vf.TaskData):
    letter: str = "e"


class LetterTask(vf.Task[LetterData]):
    @vf.reward
    async def has_letter(self, trace: vf.Trace) -> float:
        return float(self.data.letter in trace.last_reply)

    @vf.reward(weight=0.5)
    async def length(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class LetterConfig(vf.TasksetConfig):
    letters: str = "ea"


class LetterTaskset(vf.Taskset[LetterTask, LetterConfig]):
    def load(self) -> Iterator[LetterTask]:
        for letter in self.config.letters:
            yield LetterTask(LetterData(prompt=f"Say a word with {letter}.", system_prompt="Be short.", letter=letter),
                             self.config.task)


def verifiers_scores(task: vf.Task, reply: str) -> dict[str, float]:
    """What verifiers' own `Task.score` gives one reply, on a trace built here node by node (system, user, the
    sampled reply), not through the adapter."""
    messages = [vf.SystemMessage(content=task.data.system_prompt), vf.UserMessage(content=task.data.prompt),
                vf.AssistantMessage(content=reply)]
    nodes = [MessageNode(parent=i - 1 if i else None, message=m, sampled=i == 2) for i, m in enumerate(messages)]
    trace = vf.Trace(task=vf.TraceTask(type="LetterTask", data=task.data), agent=vf.AgentInfo(config=vf.AgentConfig()),
                     nodes=nodes)
    asyncio.run(task.score(trace))
    return {name: reward.value for name, reward in trace.rewards.items()}


@pytest.mark.heavy
def test_a_tiny_models_episodes_get_the_rewards_verifiers_gives_their_replies(model, tok):  # noqa: F811
    """Episodes the tiny model samples on both tasks of the letter taskset (G = 3 each, 4-token replies): each
    episode's reward parts are verifiers' weighted scores of its reply, has_letter x 1.0 and len(reply) x 0.5, as
    `Task.score` gives them on a trace built without the adapter."""
    make = verifiers_factory(LetterTaskset, "LetterTaskset", {}, tok)
    rows = [{"idx": 0}, {"idx": 1}]
    prompts, dropped = encode_prompts(tok, rows, max_prompt_len=128, env_factory=make)
    assert dropped == 0
    episodes = play_episodes(model, tok, [p.ids for p in prompts], [p.columns for p in prompts], make, group_size=3,
                             max_new_tokens=4, max_turns=1, episode_tokens=4, temperature=1.0, seed=0)
    tasks = list(LetterTaskset(LetterConfig()))
    lengths = set()
    for r, (reply, parts) in enumerate(zip(episodes.final_texts, episodes.turn_rewards)):
        assert parts == pytest.approx(verifiers_scores(tasks[r // 3], reply.strip()), abs=1e-12)
        lengths.add(parts["length"])
    assert len(lengths) > 1, "the check needs replies that verifiers scores differently"


class CountState(vf.State):
    lookups: int = 0


class Counter(vf.Toolset[vf.ToolsetConfig, CountState]):
    TOOL_PREFIX = None  # the tool is offered bare, as `look`

    @vf.tool
    async def look(self, what: str) -> str:
        """Looks something up."""
        self.state.lookups += 1
        return f"{what} is {self.state.lookups}"


class StopTask(vf.Task[vf.TaskData, CountState]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Counter(vf.ToolsetConfig())]

    @vf.stop
    async def looked_twice(self, trace: vf.Trace) -> bool:
        return trace.state.lookups >= 2

    @vf.stop
    async def gave_up(self, response: vf.Response) -> bool:
        return "give up" in (response.message.content or "")

    @vf.reward
    async def lookups(self, trace: vf.Trace) -> float:
        return float(trace.state.lookups)


class StopTaskset(vf.Taskset[StopTask, vf.TasksetConfig]):
    def load(self) -> Iterator[StopTask]:
        yield StopTask(vf.TaskData(prompt="Look things up.", id="only"), self.config.task)


def look(what: str) -> str:
    return f'<tool_call>{{"name": "look", "arguments": {{"what": "{what}"}}}}</tool_call>'


def test_stops_end_an_episode_where_the_interception_server_would_and_tools_share_the_rollout_state(tok):
    """The Counter tool counts its calls in the rollout's `trace.state`, which the task's reward and its Trace
    stop read. Two lookups: before a third reply, `looked_twice` ends the episode (the second result is never
    committed, as a refused request commits nothing), scored 2. A reply saying "give up" ends it through the
    Response stop `gave_up` after one lookup, scored 1."""
    make = verifiers_factory(StopTaskset, "StopTaskset", {}, tok)
    env = make()
    replies = iter([look("a"), look("b"), look("c")])
    episode = run_episode(env, {"id": "only"}, lambda m: next(replies), tokenizer=tok, limits=EpisodeLimits(8))
    assert episode.turns == 2 and episode.rewards == {"lookups": 2.0} and episode.metrics["verifiers_stopped"] == 1.0
    assert env.trace.stop_condition == "looked_twice" and env.trace.state.lookups == 2
    assert [m.role for m in env.trace.messages] == ["user", "assistant", "tool", "assistant"]
    assert episode.messages[-1] == {"role": "assistant", "content": look("b")}
    env = make()
    replies = iter([look("a"), "I give up"])
    episode = run_episode(env, {"idx": 0}, lambda m: next(replies), tokenizer=tok, limits=EpisodeLimits(8))
    assert episode.turns == 2 and episode.rewards == {"lookups": 1.0} and env.trace.stop_condition == "gave_up"
    assert episode.messages[3] == {"role": "tool", "name": "look", "content": "a is 1"}  # after system, user, call


def taskset_of(task_class: type, data: vf.TaskData | None = None) -> type:
    """A one-task taskset of `task_class`."""

    class OneTaskset(vf.Taskset[task_class, vf.TasksetConfig]):
        def load(self) -> Iterator[vf.Task]:
            yield task_class(data or vf.TaskData(prompt="Hi."), self.config.task)

    return OneTaskset


class BoxedTask(LetterTask):
    NEEDS_CONTAINER = True


class JudgedTaskset(LetterTaskset):
    def load(self) -> Iterator[LetterTask]:
        yield LetterTask(LetterData(prompt="Hi."), vf.TaskConfig(judges=[{"id": "decision"}]))


class InterceptTask(LetterTask):
    @vf.intercept
    async def rewrite(self, request: vf.Request) -> vf.Request | None:
        return None


class FinalizeTask(LetterTask):
    async def finalize(self, trace: vf.Trace, runtime: object) -> None:
        return None


class SetupTask(LetterTask):
    async def setup(self, trace: vf.Trace, runtime: object) -> None:
        return None


class RuntimeRewardTask(LetterTask):
    @vf.reward
    async def in_box(self, trace: vf.Trace, runtime: object) -> float:
        return 1.0


class SyncRewardTask(LetterTask):
    @vf.reward
    def quick(self, trace: vf.Trace) -> float:
        return 1.0


class RemoteToolTask(LetterTask):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Counter(vf.ToolsetConfig(url="http://tools.example/mcp"))]


class TwinToolTask(LetterTask):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Counter(vf.ToolsetConfig()), Counter(vf.ToolsetConfig())]


class DirectUserSim(UserSimEnv):
    pass


def empty_taskset() -> vf.Taskset:
    class Empty(LetterTaskset):
        def load(self) -> Iterator[LetterTask]:
            return iter(())

    return Empty(LetterConfig())


@pytest.mark.parametrize("builder, options, message", [
    (DirectUserSim, {}, "DirectUserSim is a verifiers Env, which plays its own agents"),
    (LetterTaskset, {"letters": 3}, r"env.options do not fit LetterTaskset \(LetterConfig\): letters: Input should"),
    (LetterTaskset, {"colour": "red"}, "colour: Extra inputs are not permitted"),
    (empty_taskset, {"colour": "red"}, "env.options do not fit empty_taskset: .* unexpected keyword argument"),
    (empty_taskset, {}, "the taskset yields no tasks"),
    (lambda: "tasks", {}, "returned a str, not a verifiers Taskset"),
    (("not", "callable"), {}, "a tuple is not a Taskset class or a function that builds one"),
    (taskset_of(BoxedTask), {}, "BoxedTask.NEEDS_CONTAINER is set"),
    (JudgedTaskset, {}, r"LetterTask has judges \['decision'\]: a judge scores by calling a model"),
    (taskset_of(InterceptTask), {}, r"@vf.intercept hooks \['rewrite'\]"),
    (taskset_of(FinalizeTask), {}, "FinalizeTask overrides finalize, a once-per-rollout hook"),
    (taskset_of(SetupTask), {}, "SetupTask.setup takes a runtime"),
    (taskset_of(RuntimeRewardTask), {}, "@vf.reward 'in_box' takes a runtime"),
    (taskset_of(SyncRewardTask), {}, "@vf.reward 'quick' is not `async def`"),
    (taskset_of(RemoteToolTask), {}, "toolset Counter is served from http://tools.example/mcp"),
    (taskset_of(TwinToolTask, LetterData(prompt="Hi.")), {}, "two toolsets offer a tool named 'look'"),
    (taskset_of(LetterTask, vf.TaskData()), {}, "has no prompt: the user opens the conversation"),
])
def test_what_in_process_play_cannot_run_is_refused_with_one_line(builder, options, message, tok):
    with pytest.raises(ConfigError, match=message):
        verifiers_factory(builder, getattr(builder, "__name__", "builder"), options, tok)


def test_task_rows_name_a_task_by_position_or_id(tok):
    make = verifiers_factory(LetterTaskset, "LetterTaskset", {}, tok)
    assert make().reset({"idx": 1})[1] == {"role": "user", "content": "Say a word with a."}
    for row, message in [({"idx": 2}, r"LetterTaskset has 2 tasks \(idx 0 to 1\)"),
                         ({"id": "x"}, "no task of LetterTaskset has that TaskData.id"),
                         ({"seed": 3}, "names one task, by position"), ({"idx": 0, "id": "x"}, "names one task")]:
        with pytest.raises(DataError, match=message):
            make().reset(row)


def test_the_tasksets_own_config_reweights_a_reward_as_verifiers_would(tok):
    """env.options are LetterConfig's fields, `task` among them: `length` re-weighted to 2.0 (a plugged entry
    without a function keeps the method and overrides its weight). Reply "abc" on task 0 (letter e): has_letter
    0 x 1.0, length 3 x 2.0 = 6.0."""
    make = verifiers_factory(LetterTaskset, "LetterTaskset", {"task": {"rewards": {"length": {"weight": 2.0}}}}, tok)
    env = make()
    env.reset({"idx": 0})
    result = env.step("abc")
    assert result.done and result.rewards == {"has_letter": 0.0, "length": 6.0}


class FragileTask(LetterTask):
    @vf.reward
    async def parses(self, trace: vf.Trace) -> float:
        return float(int(trace.last_reply))


def test_a_reward_that_raises_scores_the_reply_0_and_is_counted(tok):
    """`parses` raises on "x": verifiers fails that scoring, so the reply scores 0 on every reward (has_letter
    too), the error is counted and shown once; "12" then scores parses 12, has_letter 0, length 2 x 0.5 = 1."""
    make = verifiers_factory(taskset_of(FragileTask, LetterData(prompt="Hi.")), "FragileTaskset", {}, tok)
    env = make()
    env.reset({"idx": 0})
    with pytest.warns(RuntimeWarning, match="verifiers scoring of FragileTask failed, scored 0: .*invalid literal"):
        result = env.step("x")
    assert result.rewards == {"has_letter": 0.0, "length": 0.0, "parses": 0.0}
    assert env.metrics()["verifiers_scoring_errors"] == 1.0
    env.reset({"idx": 0})
    assert env.step("12").rewards == {"has_letter": 0.0, "length": 1.0, "parses": 12.0}


def test_a_recipe_naming_verifiers_without_the_package_is_told_the_extra(tok, monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)
    monkeypatch.delitem(sys.modules, "tempax.envs.verifiers")
    with pytest.raises(ConfigError, match=r"needs the verifiers package \(0.4\): pip install -e \"\.\[verifiers\]\""):
        SHOP.build(tok)


@pytest.fixture(scope="module")
def long_model():
    """The tiny model with room for the shop's prompt, whose tool list the tiny tokenizer spells out in about 650
    tokens (SmolLM2's takes about 200)."""
    return tiny_tempax_model("llama", vocab_size=400, num_layers=2, max_position_embeddings=1024)


@pytest.mark.heavy
def test_the_verifiers_recipe_trains_two_grpo_steps(long_model, tok, tmp_path, monkeypatch):
    """recipes/grpo_verifiers_shop.yaml with the tiny model: 2 GRPO steps over episodes of the example taskset;
    the rewards are the task's own (reward/correct_mean, reward/brief_mean), the episodes' tool counters logged."""
    monkeypatch.chdir(ROOT)
    run = two_tiny_steps(RECIPE, long_model, tok, tmp_path, "grpo.max_prompt_len=1024")
    m = run.history[0][1]
    assert {"reward/correct_mean", "reward/brief_mean", "episode/verifiers_tool_calls_mean"} <= set(m)
    assert np.isfinite(run.losses).all()
