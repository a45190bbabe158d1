"""Ray stays optional (`tempax.rl.workers`): nothing loads it unless a run asks for rollout workers."""

from __future__ import annotations

import os
import subprocess
import sys

from tempax.algorithms.grpo.config import GRPOConfig
from tempax.configlib import load_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHECK = """
import sys
from tempax.cli.main import main
try:
    main(["--help"])
except SystemExit:
    pass
import tempax.algorithms.grpo.main, tempax.algorithms.grpo.source, tempax.rl.async_source  # a run without workers
print("ray loaded:", "ray" in sys.modules)
"""


def test_help_and_runs_without_workers_do_not_import_ray():
    """`tempax --help` and the GRPO modules (everything a run with grpo.workers: 0 imports) leave `ray` unloaded."""
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ray loaded: False" in out.stdout


def test_worker_settings_parse_from_overrides():
    """grpo.workers / grpo.max_staleness / ray.* are typed config keys; max_staleness without workers and
    stale rollouts with top_p < 1 are refused with the fix."""
    import pytest

    from tempax.errors import ConfigError

    cfg = load_config(GRPOConfig, None, ["grpo.workers=2", "grpo.max_staleness=1", "ray.address=auto",
                                         "ray.timeout_s=30", "ray.worker_cpus=[1]"])
    assert (cfg.grpo.workers, cfg.grpo.max_staleness, cfg.ray.address, cfg.ray.timeout_s, cfg.ray.worker_cpus) == \
        (2, 1, "auto", 30.0, (1,))
    with pytest.raises(ConfigError, match="set grpo.workers >= 1"):
        load_config(GRPOConfig, None, ["grpo.max_staleness=1"])
    with pytest.raises(ConfigError, match="grpo.top_p=1.0 or grpo.max_staleness=0"):
        load_config(GRPOConfig, None, ["grpo.workers=1", "grpo.max_staleness=1", "grpo.top_p=0.9"])
    with pytest.raises(ConfigError, match="grpo.num_iterations=1"):
        load_config(GRPOConfig, None, ["grpo.workers=1", "grpo.num_iterations=2"])
