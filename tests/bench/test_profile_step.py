"""bench/profile_step.py's device tables: leaf operations, busy time and the per-step split, on a hand-made
timeline (a TPU trace's "XLA Ops" and "XLA Modules" lines have this form)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import profile_step  # noqa: E402


def test_a_loop_event_that_spans_its_body_is_not_counted_twice():
    loop = ("while.3", 0, 100, {})
    body = [("fusion.1", 10, 30, {}), ("fusion.2", 50, 40, {})]
    after = ("copy.4", 120, 10, {})
    assert profile_step.leaf_events([loop, *body, after]) == [*body, after]


def test_busy_time_is_the_union_of_intervals():
    events = [("a", 0, 10, {}), ("b", 5, 10, {}), ("c", 30, 5, {}), ("d", 31, 2, {})]
    assert profile_step.busy_ns(events) == 15 + 5


def test_categories_prefer_the_profilers_own_and_fold_numbers():
    assert profile_step.op_category("fusion.12", {"hlo_category": "convolution fusion"}) == "convolution fusion"
    assert profile_step.op_category("copy.7", {}) == "copy"
    long_name = '%fusion.3 = bf16[8,1024]{1,0} fusion(...), metadata={op_name="jit(step)/layer_12/dot_general"}'
    assert profile_step.op_source({"long_name": long_name}) == "jit(step)/layer_N/dot_general"
    assert profile_step.op_source({"tf_op": "jit(step)/exp"}) == "jit(step)/exp"
    assert profile_step.op_source({}) == "?"


def test_summary_per_step_with_idle_time(capsys):
    ms = 1_000_000
    ops = [
        ("while.1", 0, 6 * ms, {}),
        ("fusion.1", 0, 4 * ms, {"hlo_category": "convolution fusion", "tf_op": "jit(step)/dot_general"}),
        ("custom-call.2", 4 * ms, 2 * ms, {"hlo_category": "custom-call", "tf_op": "jit(step)/splash"}),
        ("fusion.1", 10 * ms, 4 * ms, {"hlo_category": "convolution fusion", "tf_op": "jit(step)/dot_general"}),
        ("custom-call.2", 14 * ms, 2 * ms, {"hlo_category": "custom-call", "tf_op": "jit(step)/splash"}),
    ]
    modules = [("jit_step(12)", 0, 6 * ms, {}), ("jit_step(12)", 10 * ms, 6 * ms, {})]
    table = profile_step.summarize_device(ops, modules, "/device:TPU:0", steps=2, wall_s=0.020)
    assert table["busy_ms_per_step"] == pytest.approx(6.0)
    assert table["wall_ms_per_step"] == pytest.approx(10.0)
    assert table["idle_ms_per_step"] == pytest.approx(4.0)
    assert table["by_category_ms"] == {"convolution fusion": 4.0, "custom-call": 2.0}
    assert table["by_source_ms"][0] == ["convolution fusion", "jit(step)/dot_general", 4.0]
    assert table["programs"] == [["jit_step", 1.0, 6.0]]
    assert "idle 4.00" in capsys.readouterr().out


def test_a_tpu_event_named_by_its_hlo_text_is_classified_by_opcode_and_fusion_kind():
    product = ("%fusion.963 = bf16[8,1024,8192]{2,1,0:T(8,128)(2,1)} fusion(bf16[8,1024,8192]{2,1,0} %fusion.962), "
               "kind=kOutput, calls=%fused_computation.30.clone")
    assert profile_step.op_category(product, {}) == "products (convolution fusions)"
    assert profile_step.op_source({}, product) == "%fusion.963 = bf16[8,1024,8192]"
    loop = "%fusion.1 = f32[8]{0} fusion(f32[8]{0} %p), kind=kLoop, calls=%c"
    assert profile_step.op_category(loop, {}) == "elementwise (loop fusions)"
    kernel = ('%splash.16 = (f32[8,512,128]{2,1,0}) custom-call(s8[1,2,2]{2,1,0} %a), '
              'custom_call_target="tpu_custom_call"')
    assert profile_step.op_category(kernel, {}) == "Pallas kernels (custom-call)"
    assert profile_step.op_source({}, kernel) == "%splash.16 = (f32[8,512,128])"
    pair = "%fusion.5 = (f32[64]{0:T(128)S(1)}, f32[64,9]{1,0:T(8,128)}) fusion(bf16[9,2]{1,0} %a), kind=kOutput"
    assert profile_step.op_source({}, pair) == "%fusion.5 = (f32[64], f32[64,9])"
    update = "%dynamic_update_slice.55 = f32[30,8]{1,0} dynamic-update-slice(f32[30,8]{1,0} %a, f32[30,1]{1,0} %b)"
    assert profile_step.op_category(update, {}) == "dynamic-update-slice"


def test_host_functions_are_per_step_and_sorted_by_own_time():
    import cProfile
    import pstats

    def busy():
        return sum(i * i for i in range(20000))

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(4):
        busy()
    profile.disable()
    rows = profile_step.host_functions(pstats.Stats(profile), steps=2, top=5)
    assert len(rows) <= 5 and all(len(row) == 3 for row in rows)
    assert [row[1] for row in rows] == sorted((row[1] for row in rows), reverse=True)
    assert any("busy" in row[0] or "genexpr" in row[0] for row in rows)
    assert all(row[2] >= row[1] for row in rows)
