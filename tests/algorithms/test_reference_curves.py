"""Every algorithm's first steps on a tiny model equal the stored reference curves (`tests/reference_curves`).

On a machine class a curve was stored for (CPU model and vector-unit class, the keys of its `curves`) the
losses and rewards must be identical: the same
code on the same machine class is deterministic, so any difference is a behaviour change. On another class
the vector units order float32 sums differently, and a few steps at learning rate 1e-2 amplify that; there the
curves must agree to rtol 1e-3 / atol 1e-5 (sampled completions of GRPO/PPO may differ there, which shows as a
failure worth a look, not as noise). Regenerate with TEMPAX_WRITE_REFERENCE_CURVES=1 (see the package docstring).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests import reference_curves as rc
from tests.kit.compile_cache import persistent_compile_cache

WRITE = os.environ.get("TEMPAX_WRITE_REFERENCE_CURVES") == "1"
CROSS_CPU_RTOL, CROSS_CPU_ATOL = 1e-3, 1e-5
# Algorithms whose accuracy counts margins against a reference model that starts equal to the policy.
SIGN_COUNTS_AGAINST_REFERENCE = ("dpo", "kto")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request):
    """Every reference run, in order (GRPO and PPO score with the reward model the reward_model run saves).

    Compiled programs are kept in pytest's cache folder between sessions: compilation is most of these runs'
    time, and a cached executable computes exactly what a fresh compile of the same program does."""
    workdir = str(tmp_path_factory.mktemp("curves"))
    configs = rc.raw_configs(workdir)
    with persistent_compile_cache(request.config.cache.mkdir("reference-curves-xla")):
        return {name: rc.run_one(name, workdir, configs) for name in rc.NAMES}


@pytest.mark.parametrize("name", rc.NAMES)
@pytest.mark.heavy
def test_run_equals_the_stored_curve(runs, name):
    new = runs[name]
    if WRITE:
        rc.write(name, new)
    stored_by_class = rc.read(name)["curves"]
    here = rc.cpu_model()
    exact = here in stored_by_class
    for machine_class, stored in stored_by_class.items():
        if exact and machine_class != here:
            continue
        assert new["steps"] == stored["steps"] == list(range(1, rc.STEPS + 1))
        assert "loss" in stored["series"], sorted(stored["series"])
        missing = sorted(set(stored["series"]) - set(new["series"]))
        assert not missing, f"{name}: metrics no longer logged: {missing}"
        for key, values in stored["series"].items():
            if exact:
                assert new["series"][key] == values, f"{name}/{key}: {new['series'][key]} != stored {values}"
            else:
                # A sign count ("accuracy": pairs with margin > 0) at step 1, where the policy is its reference,
                # counts float noise around 0, and which side of 0 it lands on is the machine's.
                first = 1 if "accuracy" in key and name in SIGN_COUNTS_AGAINST_REFERENCE else 0
                np.testing.assert_allclose(new["series"][key][first:], values[first:], rtol=CROSS_CPU_RTOL, atol=CROSS_CPU_ATOL,
                                           err_msg=f"{name}/{key} (stored on {machine_class}, run on {here})")
