"""tempax.parallel.mesh: the (data, fsdp, tensor) mesh over the eight test devices, and joining a multi-process
run (the single-process cases and the refusals; the two-process runs are tests/parallel/test_multiprocess.py)."""

from __future__ import annotations

import jax
import pytest
from jax.sharding import AxisType

from tempax.errors import ConfigError
from tempax.parallel.mesh import MESH_AXES, init_distributed, make_mesh


def test_the_rest_axis_takes_the_devices_the_others_leave():
    """8 devices: fsdp 2 x tensor 2 leaves data 8 / 4 = 2; data 2, tensor 1 leaves fsdp 4; the default is all data."""
    assert len(jax.devices()) == 8  # tests/conftest.py
    assert dict(make_mesh(fsdp=2, tensor=2).shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert dict(make_mesh(data=2, fsdp=-1).shape) == {"data": 2, "fsdp": 4, "tensor": 1}
    mesh = make_mesh()
    assert mesh.axis_names == MESH_AXES and dict(mesh.shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert set(mesh.axis_types) == {AxisType.Auto}
    assert dict(make_mesh(data=1, fsdp=2, tensor=1, devices=jax.devices()[:2]).shape)["fsdp"] == 2


@pytest.mark.parametrize(("sizes", "message"), [
    ({"data": 0}, "mesh axis 'data' must be a positive int or -1"),
    ({"fsdp": True}, "mesh axis 'fsdp' must be a positive int or -1"),
    ({"data": -1, "fsdp": -1}, "only one mesh axis may be -1 .* data, fsdp"),
    ({"fsdp": 3}, "the fixed axes need a multiple of 3 devices but there are 8"),
    ({"data": 2, "fsdp": 2, "tensor": 1}, r"mesh data=2 x fsdp=2 x tensor=1 needs 4 devices but there are 8"),
])
def test_sizes_that_do_not_fit_the_devices_are_named(sizes, message):
    with pytest.raises(ConfigError, match=message):
        make_mesh(**sizes)


def test_one_process_joins_nothing(monkeypatch):
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    assert init_distributed() is False
    assert init_distributed(num_processes=1) is False


def test_incomplete_or_wrong_multi_process_settings_are_refused(monkeypatch):
    """Refused before JAX is asked to join anything: a missing process id names all three settings, an id outside
    [0, n) names the range, and an environment value that is not a number names the variable."""
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    # A multi-process request sets JAX's CPU collectives and recoverability first: put them back for later tests.
    settings = ("jax_cpu_collectives_implementation", "jax_enable_recoverability")
    before = {name: getattr(jax.config, name) for name in settings}
    try:
        with pytest.raises(ConfigError, match="need coordinator_address, num_processes and process_id together"):
            init_distributed(coordinator_address="127.0.0.1:1234", num_processes=2)
        with pytest.raises(ConfigError, match=r"process_id must be in \[0, 2\), got 2"):
            init_distributed(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=2)
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(ConfigError, match="environment variable JAX_NUM_PROCESSES='two' must be an integer"):
        init_distributed()
