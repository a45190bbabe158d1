"""A run's metric curves (from its metrics.jsonl) drawn to one PNG: one panel per metric, the training series and
its `eval/` series together (loss with eval/loss, learning rate, gradient norm, tokens/s, and any other requested
metric). `tempax plot RUN_DIR` draws any run; the demo draws its GRPO stage's reward curves. Uses matplotlib's Agg
backend, so no display is needed.
"""

from __future__ import annotations

import os

from tempax.errors import ConfigError

# matplotlib and the metrics reader are imported in `plot_run`: `tempax plot --help` stays light.

DEFAULT_METRICS = ("loss", "lr", "grad_norm", "tokens_per_s", "token_accuracy")


def plot_run(run_dir: str, out_dir: str | None = None, metrics: tuple[str, ...] | None = None) -> str:
    """Draws the curves of `run_dir` and returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tempax.train.metrics import read_metrics, summarize

    records = read_metrics(run_dir)
    wanted = list(metrics or DEFAULT_METRICS)
    panels = [(m, summarize(records, m), summarize(records, f"eval/{m}")) for m in wanted]
    panels = [p for p in panels if p[1] or p[2]]
    if not panels:
        raise ConfigError(f"{run_dir}: metrics.jsonl has none of the metrics {', '.join(wanted)}")
    cols = min(len(panels), 2)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
    for ax, (name, train, evals) in zip(axes.flat, panels):
        if train:
            ax.plot(*zip(*train), label="train", linewidth=1.2)
        if evals:
            ax.plot(*zip(*evals), "o-", label="eval", linewidth=1.2, markersize=3)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if train and evals:
            ax.legend()
        if name == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(os.path.basename(os.path.abspath(run_dir)))
    fig.tight_layout()
    out_dir = out_dir or os.path.join(run_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "metrics.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# The curves of a GRPO run that show whether it learned: rewards (total and per function), the share of groups
# without reward spread (no learning signal), entropy and completion length.
GRPO_METRICS = ("reward/total_mean", "reward/correctness_mean", "reward/format_mean", "groups/zero_spread_frac",
                "entropy", "completion/length_mean")


def plot_rewards(grpo_dir: str, out_path: str) -> str:
    """The GRPO reward curves (`GRPO_METRICS`) of the run in `grpo_dir` as one PNG at `out_path`."""
    folder = os.path.dirname(out_path)
    path = plot_run(grpo_dir, out_dir=folder, metrics=GRPO_METRICS)
    os.replace(path, out_path)
    return out_path
