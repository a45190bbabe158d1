"""The model card `tempax export` writes: README.md in a Hugging Face folder, `general.*` metadata in a GGUF file.

Everything on the card is read from what the run left in its directory, never re-measured:
  config.yaml         the recipe in effect (its `command:` key names the algorithm), hyper-parameters
                      (the sections its record names as `knobs`);
  data_report.json    each data set's path and its row counts before and after cleaning;
  summary.json        the steps trained;
  eval_summary.json   held-out loss metrics before and after training (SFT, DPO, KTO, reward models);
  eval.json           generation-based evaluations before and after training (GRPO, PPO).
The algorithm's own words come from its record (`tempax.algorithms.registry.Algorithm.card`: what the method
optimises, with its paper), so a new algorithm's card needs nothing here. A model exported straight from a source
(no run) gets a card naming the source and the conversion.

The README's YAML front matter holds the fields the Hugging Face Hub renders (base_model, library_name, license,
tags, datasets, pipeline_tag); `base_model` and `datasets` name Hub repos only, since the Hub links them, and
local paths appear in the text instead. The GGUF file gets llama.cpp's standard `general.*` keys (name,
description, license, base_model.*, dataset.*, tags) and the rest under `general.training.*`: algorithm,
recipe (the config.yaml text), hyper-parameters, data and evaluation (JSON), framework versions and the commands.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any
from tempax.algorithms.registry import algorithms
from tempax.algorithms.run_dirs import config_command
from tempax.configlib import COMMAND_KEY, upgrade_keys
from tempax.models.gguf_io import read_gguf_header
from tempax.models.registry import MODELS, resolve_source

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_VERSIONED_PACKAGES = ("tempax", "jax", "flax", "optax", "transformers", "gguf")


@dataclass(frozen=True)
class ModelCard:
    """What the card says.

    Attributes:
      source: the model source trained or converted (config.yaml's model.source, or the export's SOURCE).
      base_model: the base model's Hugging Face Hub repo id, when known.
      license: the base model's license, when its files say it.
      algorithm: the training command (sft, dpo, grpo...), None for a plain conversion.
      method: what the algorithm is, from its record's `card` ("" when unknown).
      recipe: config.yaml's text; empty for a plain conversion.
      lora: the LoRA settings trained ({} without adapters).
      hyperparameters: the key training settings, name -> value.
      data: one entry per data set: path and row counts (total, kept after cleaning) where the run recorded them.
      evaluation: {"before": {...}, "after": {...}} metrics, or generation-based stages, as the run wrote them.
      steps: optimizer steps trained.
      versions: package -> installed version.
      train_command: the command that repeats the training, export_command the one that repeats this export.
    """

    source: str
    base_model: str | None = None
    license: str | None = None
    algorithm: str | None = None
    method: str = ""
    recipe: str = ""
    lora: dict[str, Any] = field(default_factory=dict)
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    data: list[dict[str, Any]] = field(default_factory=list)
    evaluation: dict[str, Any] = field(default_factory=dict)
    steps: int | None = None
    versions: dict[str, str] = field(default_factory=dict)
    train_command: str | None = None
    export_command: str | None = None

    @property
    def tags(self) -> list[str]:
        tags = ["tempax"]
        if self.algorithm:
            tags.append(self.algorithm)
        if self.lora:
            tags.append("qlora" if self.lora.get("quantize_base") else "lora")
        return tags

    @property
    def hub_datasets(self) -> list[str]:
        return [d["path"] for d in self.data if _is_hub_id(str(d.get("path", "")))]


def _is_hub_id(text: str) -> bool:
    return bool(_HUB_ID.match(text)) and not os.path.exists(text)


def package_versions() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for name in _VERSIONED_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _read_json(path: str) -> Any:
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _base_model_facts(source: str) -> tuple[str | None, str | None]:
    """(Hub repo id, license) of a model source, from the registry, the Hub id itself or the files' metadata."""
    entry = MODELS.get(source)
    hub = None
    if entry is not None:
        hub = entry.base_model or entry.hub_repo
    elif _is_hub_id(source):
        hub = source
    license_ = None
    try:
        resolved = resolve_source(source)
    except Exception:  # noqa: BLE001 - an unresolvable source still gets a card naming it
        return hub, None
    if resolved.kind == "gguf" and os.path.isfile(resolved.location):
        license_ = read_gguf_header(resolved.location).metadata.get("general.license")
    elif resolved.kind == "hf_folder":
        license_ = _front_matter(os.path.join(resolved.location, "README.md")).get("license")
    return hub, (str(license_) if license_ else None)


def _front_matter(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    import yaml

    with open(path) as f:
        text = f.read()
    if not text.startswith("---"):
        return {}
    head = text[3:].split("\n---", 1)[0]
    try:
        data = yaml.safe_load(head)
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _data_entries(raw: dict[str, Any], report: Any) -> list[dict[str, Any]]:
    reports = []
    if isinstance(report, dict) and "name" in report:
        reports = [report]
    elif isinstance(report, dict):
        reports = [r for r in report.values() if isinstance(r, dict) and "name" in r]
    elif isinstance(report, list):
        reports = [r for r in report if isinstance(r, dict) and "name" in r]
    entries = [{"path": r["name"], "rows": r.get("total"), "rows_after_cleaning": r.get("kept")} for r in reports]
    named = {e["path"] for e in entries}
    for section, values in raw.items():  # data sets the report does not cover (a task, a prompt file...)
        if section in ("model", "train") or not isinstance(values, dict):
            continue
        path = values.get("path") or (values.get("name") if section == "task" else None)
        if isinstance(path, str) and path and path not in named:
            entries.append({"path": path})
    return entries


def _hyperparameters(raw: dict[str, Any], algorithm: str | None) -> dict[str, Any]:
    train = raw.get("train") or {}
    opt = train.get("optimizer") or {}
    picked = {k: train.get(k) for k in ("steps", "batch_size", "seq_len", "precision", "seed") if k in train}
    picked.update({f"optimizer.{k}": opt.get(k) for k in ("name", "learning_rate", "schedule", "warmup_steps",
                                                            "weight_decay", "grad_clip_norm") if k in opt})
    knobs = algorithms()[algorithm].knobs if algorithm in algorithms() else ()
    for section in knobs:  # the algorithm's own settings, as its record names them
        values = raw.get(section)
        if isinstance(values, dict):
            picked.update({f"{section}.{k}": v for k, v in values.items() if not isinstance(v, (dict, list))})
        elif section in raw and not isinstance(values, list):
            picked[section] = values
    return picked


def gather(*, source: str, run_dir: str | None = None, export_command: str | None = None) -> ModelCard:
    """The card of a run directory (or of a plain conversion of `source` when `run_dir` is None)."""
    if run_dir is None:
        base, license_ = _base_model_facts(source)
        return ModelCard(source=source, base_model=base, license=license_, versions=package_versions(),
                         export_command=export_command)
    import yaml

    config_path = os.path.join(run_dir, "config.yaml")
    with open(config_path) as f:
        recipe = f.read()
    raw = yaml.safe_load(recipe) or {}
    model_source = str((raw.get("model") or {}).get("source") or source)
    base, license_ = _base_model_facts(model_source)
    algorithm = config_command(raw)  # an older run's config.yaml names none: inferred from its shape
    if algorithm in algorithms():  # an older run's renamed keys under their names now, as the hyper-parameters show
        config = {k: v for k, v in raw.items() if k != COMMAND_KEY}
        raw, _ = upgrade_keys(algorithms()[algorithm].config_class(), config)
    evaluation: dict[str, Any] = {}
    for name in ("eval_summary.json", "eval.json"):
        found = _read_json(os.path.join(run_dir, name))
        if isinstance(found, dict):
            evaluation.update({k: v for k, v in found.items() if v is not None})
    summary = _read_json(os.path.join(run_dir, "summary.json")) or {}
    return ModelCard(
        source=model_source,
        base_model=base,
        license=license_,
        algorithm=algorithm,
        method=algorithms()[algorithm].card if algorithm in algorithms() else "",
        recipe=recipe,
        lora={k: v for k, v in (raw.get("lora") or {}).items()},
        hyperparameters=_hyperparameters(raw, algorithm),
        data=_data_entries(raw, _read_json(os.path.join(run_dir, "data_report.json"))),
        evaluation=evaluation,
        steps=summary.get("step"),
        versions=package_versions(),
        train_command=f"tempax {algorithm} --config config.yaml" if algorithm else None,
        export_command=export_command,
    )


# ------------------------------------------------------------------------------------------------------------
def _title(card: ModelCard) -> str:
    base = card.base_model or card.source
    if card.algorithm:
        return f"{base.rsplit('/', 1)[-1]} fine-tuned with tempax {card.algorithm}"
    return f"{base.rsplit('/', 1)[-1]} (exported by tempax)"


def _summary(card: ModelCard) -> str:
    base = card.base_model or card.source
    if not card.algorithm:
        return f"{base} converted by tempax {card.versions.get('tempax', '')}".rstrip() + "."
    method = card.algorithm
    if card.lora:
        kind = "QLoRA" if card.lora.get("quantize_base") else "LoRA"
        method += f" with {kind} (rank {card.lora.get('rank')}, alpha {card.lora.get('alpha')}, merged)"
    steps = f" for {card.steps} steps" if card.steps is not None else ""
    return f"{base} trained by tempax {method}{steps}."


def _metric_rows(evaluation: dict[str, Any]) -> list[str]:
    before, after = evaluation.get("before"), evaluation.get("after")
    if not (isinstance(before, dict) or isinstance(after, dict)):
        return []
    before, after = before or {}, after or {}
    names = [k for k in dict.fromkeys([*after, *before]) if isinstance(after.get(k, before.get(k)), (int, float))]
    rows = ["| metric | before | after |", "|---|---|---|"]
    for k in names:
        b, a = before.get(k), after.get(k)
        rows.append(f"| {k} | {'' if b is None else f'{b:.4g}'} | {'' if a is None else f'{a:.4g}'} |")
    return rows


def readme(card: ModelCard) -> str:
    """README.md text: Hub front matter, then what the model is, how it was trained and how to repeat it."""
    import yaml

    front: dict[str, Any] = {}
    if card.base_model:
        front["base_model"] = card.base_model
    front["library_name"] = "transformers"
    if card.license:
        front["license"] = card.license
    front["tags"] = card.tags
    if card.hub_datasets:
        front["datasets"] = card.hub_datasets
    front["pipeline_tag"] = "text-generation"
    lines = ["---", yaml.safe_dump(front, sort_keys=False).rstrip(), "---", "", f"# {_title(card)}", "",
             _summary(card), "", "## Base model", "", f"- source: `{card.source}`"]
    if card.base_model:
        lines.append(f"- Hugging Face Hub: [{card.base_model}](https://huggingface.co/{card.base_model})")
    if card.license:
        lines.append(f"- license: {card.license}")
    if card.algorithm:
        lines += ["", "## Training", "", f"- algorithm: `{card.algorithm}`"]
        if card.method:
            lines.append(f"- method: {card.method}")
        if card.lora:
            lines.append("- adapters: " + ", ".join(f"{k}={v}" for k, v in card.lora.items()))
        lines += ["", "### Data", "", "| data | rows | rows after cleaning |", "|---|---|---|"]
        for d in card.data:
            lines.append(f"| `{d['path']}` | {d.get('rows', '')} | {d.get('rows_after_cleaning', '')} |")
        lines += ["", "### Hyper-parameters", "", "| setting | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in card.hyperparameters.items()]
        rows = _metric_rows(card.evaluation)
        if rows:
            lines += ["", "## Evaluation (held out, before and after training)", "", *rows]
        elif card.evaluation:
            lines += ["", "## Evaluation", "", "```json", json.dumps(card.evaluation, indent=2, default=str), "```"]
    lines += ["", "## Framework versions", ""] + [f"- {k} {v}" for k, v in card.versions.items()]
    lines += ["", "## Reproduce", ""]
    if card.train_command:
        lines += ["The recipe in effect is `tempax_config.yaml` in this folder (the run's config.yaml):", "",
                  "```bash", card.train_command.replace("config.yaml", "tempax_config.yaml")]
        if card.export_command:
            lines.append(card.export_command)
        lines.append("```")
    elif card.export_command:
        lines += ["```bash", card.export_command, "```"]
    return "\n".join(lines) + "\n"


def gguf_metadata(card: ModelCard) -> dict[str, Any]:
    """The card as GGUF metadata: llama.cpp's standard `general.*` keys plus `general.training.*`."""
    meta: dict[str, Any] = {"general.name": _title(card), "general.description": _summary(card),
                            "general.tags": card.tags}
    if card.license:
        meta["general.license"] = card.license
    base = card.base_model or card.source
    meta["general.base_model.count"] = 1
    meta["general.base_model.0.name"] = base
    if card.base_model:
        meta["general.base_model.0.repo_url"] = f"https://huggingface.co/{card.base_model}"
    if card.data:
        meta["general.dataset.count"] = len(card.data)
        for i, d in enumerate(card.data):
            meta[f"general.dataset.{i}.name"] = str(d["path"])
            if _is_hub_id(str(d["path"])):
                meta[f"general.dataset.{i}.repo_url"] = f"https://huggingface.co/datasets/{d['path']}"
    training = {
        "algorithm": card.algorithm, "method": card.method or None, "recipe": card.recipe or None,
        "steps": card.steps,
        "lora": json.dumps(card.lora) if card.lora else None,
        "hyperparameters": json.dumps(card.hyperparameters, default=str) if card.hyperparameters else None,
        "data": json.dumps(card.data, default=str) if card.data else None,
        "evaluation": json.dumps(card.evaluation, default=str) if card.evaluation else None,
        "framework_versions": json.dumps(card.versions), "command": card.train_command,
        "export_command": card.export_command,
    }
    meta.update({f"general.training.{k}": v for k, v in training.items() if v is not None})
    return meta
