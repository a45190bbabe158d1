"""Would a shared-prompt layout make a preference step cheaper? The data's positions, and the step at each shape.

    python bench/preference_layout.py                                   # the DPO recipe, its default shapes
    python bench/preference_layout.py --config recipes/reward_model_smollm2_lora.yaml --shapes 16x192,6x384

A preference batch is stacked: B pairs as [2B, seq_len] rows, chosen then rejected (`tempax.data.preference`), so
every pair takes 2 x seq_len positions, its prompt is computed twice and the rest of each row is padding. The
alternative is one group a pair: the prompt once, then each reply as a part of its own that attends to the
prompt and to itself; a group takes len(chosen) + len(rejected) - len(prompt) + 1 positions (the prompt's last
token is repeated at the head of each reply's part, since it predicts each reply's first token). Groups are longer than
seq_len, so they are packed into rows of 2 x seq_len, and a static-shape step needs a fixed number of rows.

Prints, for the recipe's training pairs (tokenised as its run does):
  * the positions a pair takes: stacked, its real tokens, and as a shared-prompt group;
  * how many rows of 2 x seq_len the groups of one batch need (first-fit, largest first), over random batches
    of the recipe's pairs per batch;
  * the seconds of one step's model work at each `--shapes` [rows x length]: the policy's summed reply
    log-probs, forward and backward through the LoRA adapters, plus the reference forward with the adapters off
    (the DPO family; the reward model: its score at each row's last token, no reference), as the step does them (the
    optimizer's update, the same at every shape, is left out); the masks do not change the cost, so random
    tokens stand in;
  * the weight products of one forward over the stacked batch's positions, timed alone: a bound on the products'
    share of a step (the backward's products are about as many again);
  * the step the shared layout would take on average if each batch ran at the fewest rows it needs (one
    compiled program per row count), beside the stacked step;
  * with `--peer torch`, the same model work at each shape in PyTorch + PEFT (the recipe's LoRA on the model
    `tempax export` writes, float32, no gradient checkpointing), each shape in a child process with glibc's
    default malloc: what the peer's trainer spends on the model, without its data, optimizer and checkpointing.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def group_positions(chosen, rejected) -> tuple[int, int]:
    """(shared prompt tokens, positions of the shared-prompt group) of one tokenised pair: the prompt is the
    common token prefix before either side's first trained token."""
    import numpy as np

    first_trained = min(int(np.argmax(chosen.loss_mask)), int(np.argmax(rejected.loss_mask)))
    a, b = chosen.tokens[:first_trained], rejected.tokens[:first_trained]
    differ = np.nonzero(a != b)[0]
    prompt = int(differ[0]) if differ.size else first_trained
    return prompt, len(chosen) + len(rejected) - max(prompt, 1) + 1


def rows_needed(groups: list[int], row_len: int) -> int:
    """Rows of `row_len` positions that first-fit packing (`tempax.data.packing.plan_packing`), largest group
    first, fills with `groups`."""
    from tempax.data.packing import plan_packing

    return len(plan_packing(sorted(groups, reverse=True), row_len, max_open=max(len(groups), 1)))


def step_seconds(model, rows: int, length: int, repeats: int, *, scalar_head: bool) -> float:
    """Median seconds of a step's model work on a [rows, length] batch (see the module docstring); with
    `scalar_head` (the reward model) the score of each row's last hidden state instead of reply log-probs, and no
    reference."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from bench.decode_matmul import median_seconds
    from tempax.algorithms.preference.batches import sequence_logps
    from tempax.models.lora import disable_adapters, lora_filter

    graphdef, adapters, rest = nnx.split(model, lora_filter, ...)

    def work(adapters, rest, batch):
        m = nnx.merge(graphdef, adapters, rest)
        if scalar_head:
            hidden, _ = m.hidden_states(batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"])
            return jnp.sum(hidden[:, -1])
        policy, _ = sequence_logps(m, batch)
        with disable_adapters(m):
            reference, _ = sequence_logps(m, batch)
        return jnp.sum(policy - jax.lax.stop_gradient(reference))

    step = jax.jit(jax.grad(work))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.config.vocab_size, (rows, length)).astype(np.int32)
    mask = np.zeros((rows, length), np.float32)
    mask[:, length // 2:] = 1.0  # replies: a part of each row, as in a batch of pairs
    batch = dict(tokens=tokens, targets=np.roll(tokens, -1, axis=1), loss_mask=mask,
                 positions=np.tile(np.arange(length, dtype=np.int32), (rows, 1)),
                 segment_ids=np.ones((rows, length), np.int32))
    return median_seconds(step, adapters, rest, batch, repeats=repeats)


def torch_step_seconds(folder: str, rows: int, length: int, repeats: int, *, scalar_head: bool, rank: int,
                       alpha: float, targets: list[str]) -> float:
    """Median seconds of the model work `step_seconds` times, in PyTorch + PEFT on the Hugging Face folder
    `folder`: the reward model's sum of last hidden states, or DPO's summed reply log-probs through the adapters
    (full logits, then log-softmax and gather, as TRL's trainers compute them) minus the reference's without them;
    backward to the adapters."""
    import numpy as np
    import peft
    import torch
    import transformers

    from bench.decode_matmul import median_seconds

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    policy = peft.get_peft_model(model, peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets,
                                                        lora_dropout=0.0))
    rng = np.random.default_rng(0)
    tokens = torch.from_numpy(rng.integers(0, model.config.vocab_size, (rows, length)).astype(np.int64))
    mask = torch.zeros(rows, length - 1)
    mask[:, length // 2:] = 1.0

    def reply_logps() -> torch.Tensor:
        logits = policy(input_ids=tokens).logits[:, :-1]
        logps = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
        return (logps * mask).sum(-1)

    def work() -> None:
        policy.zero_grad(set_to_none=True)
        if scalar_head:
            loss = policy.base_model.model.model(input_ids=tokens).last_hidden_state[:, -1].sum()
        else:
            with torch.no_grad(), policy.disable_adapter():
                reference = reply_logps()
            loss = (reply_logps() - reference).sum()
        loss.backward()

    return median_seconds(work, repeats=repeats)  # work() returns None: nothing for JAX to wait on


def torch_peer_seconds(cfg, shapes: list[tuple[int, int]], repeats: int, *, scalar_head: bool) -> dict:
    """`torch_step_seconds` at each shape, each in a child process of this file (`--torch-one`) with glibc's
    default malloc and no XLA flags, on the model `tempax export` writes to a temporary folder."""
    import json
    import subprocess
    import tempfile

    repo = os.path.dirname(HERE)
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "XLA_FLAGS")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    seconds = {}
    with tempfile.TemporaryDirectory(prefix="tempax-peer-") as folder:
        subprocess.run([sys.executable, "-m", "tempax.cli.main", "export", cfg.model.source, folder], cwd=repo,
                       env=env, check=True, stdout=subprocess.DEVNULL)
        for rows, length in shapes:
            spec = dict(folder=folder, rows=rows, length=length, repeats=repeats, scalar_head=scalar_head,
                        rank=cfg.lora.rank, alpha=cfg.lora.alpha, targets=list(cfg.lora.target_modules))
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-one", json.dumps(spec)],
                                 cwd=repo, env=env, check=True, capture_output=True, text=True).stdout
            seconds[rows, length] = float(out.split()[-1])
    return seconds


def forward_products_seconds(config, tokens: int, repeats: int) -> tuple[float, float]:
    """(median seconds, FLOP) of the weight products of one forward over `tokens` positions, timed alone: every
    layer's q, k, v, o, gate, up and down as plain products of random float32 operands in one jitted function.
    A step's products cannot run faster than this; its backward has about as many again."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from bench.decode_matmul import median_seconds

    d, f, q, kv = (config.hidden_size, config.intermediate_size, config.num_heads * config.head_dim,
                   config.num_kv_heads * config.head_dim)
    shapes = [(d, q), (d, kv), (d, kv), (q, d), (d, f), (d, f), (f, d)]
    rng = np.random.default_rng(0)
    weights = [jnp.asarray(rng.standard_normal(s, np.float32)) for _ in range(config.num_layers) for s in shapes]
    inputs = {n: jnp.asarray(rng.standard_normal((tokens, n), np.float32)) for n in {d, f, q}}
    products = jax.jit(lambda inputs, weights: [jnp.sum(inputs[w.shape[0]] @ w) for w in weights])
    seconds = median_seconds(products, inputs, weights, repeats=repeats)
    return seconds, float(sum(2 * tokens * a * b for a, b in shapes) * config.num_layers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="recipes/dpo_smollm2_lora.yaml")
    parser.add_argument("--shapes", default=None,
                        help="[rows]x[length],... to time; default: the stacked shape and 2..B rows of 2 x seq_len")
    parser.add_argument("--batches", type=int, default=2000, help="random batches drawn for the row counts")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--peer", choices=["torch"], default=None,
                        help="also time the same model work in PyTorch + PEFT at each shape")
    parser.add_argument("--torch-one", default=None, help=argparse.SUPPRESS)  # a child of --peer torch
    args = parser.parse_args()
    if args.torch_one:
        import json

        spec = json.loads(args.torch_one)
        print(torch_step_seconds(spec.pop("folder"), spec.pop("rows"), spec.pop("length"), spec.pop("repeats"),
                                 **spec))
        return 0

    from tempax.runtime.process import settings_in_effect, setup_process

    setup_process("train")  # the settings a training command runs with
    import numpy as np

    from tempax.algorithms.common import build_model
    from tempax.algorithms.preference.data import build_preference_data
    from tempax.algorithms.registry import get
    from tempax.configlib import load_config, recipe_command

    command = recipe_command(args.config)
    cfg = load_config(get(command).config_class(), args.config, [], command=command)
    seq_len, pairs_per_batch = cfg.train.seq_len, cfg.train.batch_size // 2
    model, tokenizer, _ = build_model(cfg)
    data = build_preference_data(cfg.data, tokenizer, seq_len=seq_len, seed=cfg.train.seed)
    real = np.array([len(p.chosen) + len(p.rejected) for p in data.train])
    prompt, groups = map(np.array, zip(*(group_positions(p.chosen, p.rejected) for p in data.train)))
    print(f"CPU: {settings_in_effect()['cpu']}")
    print(f"{args.config} ({command}): {len(data.train)} training pairs, {pairs_per_batch} a batch, seq_len {seq_len}")
    print(f"positions a pair: stacked {2 * seq_len}, real tokens {real.mean():.1f}, shared-prompt group "
          f"{groups.mean():.1f} (median {np.median(groups):.0f}, largest {groups.max()}); prompt {prompt.mean():.1f}")

    row_len = 2 * seq_len
    rng = np.random.default_rng(0)
    counts = [rows_needed(list(groups[rng.permutation(len(groups))[:pairs_per_batch]]), row_len)
              for _ in range(args.batches)]
    share = {r: counts.count(r) / len(counts) for r in sorted(set(counts))}
    print(f"rows of {row_len} a batch needs: " + ", ".join(f"{r}: {100 * s:.1f}%" for r, s in share.items()))

    stacked = (2 * pairs_per_batch, seq_len)
    shapes = ([stacked] + [(r, row_len) for r in share] if args.shapes is None
              else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")])
    seconds = {}
    for rows, length in shapes:
        seconds[rows, length] = step_seconds(model, rows, length, args.repeats, scalar_head=command == "reward-model")
        print(f"[{rows} x {length}] {rows * length} positions: {seconds[rows, length]:.2f} s a step", flush=True)
    if args.peer == "torch":
        import torch

        peer = torch_peer_seconds(cfg, shapes, args.repeats, scalar_head=command == "reward-model")
        for (rows, length), value in peer.items():
            print(f"[{rows} x {length}] PyTorch {torch.__version__} + PEFT, the same model work: {value:.2f} s a step "
                  f"(tempax {seconds[rows, length]:.2f} s, {seconds[rows, length] / value:.2f}x)", flush=True)
    stacked_seconds, flop = forward_products_seconds(model.config, stacked[0] * stacked[1], args.repeats)
    print(f"the weight products of one forward over {stacked[0] * stacked[1]} positions, alone: "
          f"{stacked_seconds:.2f} s, {flop / 1e9:.0f} GFLOP at {flop / stacked_seconds / 1e9:.0f} GFLOP/s")
    if stacked in seconds and all((r, row_len) in seconds for r in share):
        shared = sum(s * seconds[r, row_len] for r, s in share.items())
        print(f"shared-prompt layout, each batch at the rows it needs: {shared:.2f} s a step on average, against "
              f"{seconds[stacked]:.2f} s stacked ({shared / seconds[stacked]:.2f}x), with {len(share)} programs "
              "to compile instead of one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
