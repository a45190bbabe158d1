"""bench/sft_compile_v5e.py's parts that run without libtpu: the loss forms it compiles, the HLO counts it reports,
and its refusal of an unknown form."""

import pytest

from bench import sft_compile_v5e

HLO = """HloModule jit_step, is_scheduled=true

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %x)
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %w = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body
  ROOT %r = f32[4]{0} get-tuple-element(%w), index=1
}
"""


def test_forms_are_the_sft_loss_settings_a_run_takes():
    assert [(s.fused, s.chunk_len) for s in map(sft_compile_v5e.loss_spec, ("fused64", "fused_whole", "plain"))] == [
        (True, 64), (True, None), (False, None)]


def test_hlo_counts_count_instructions_and_while_loops():
    """Six instructions (three in the body, three in the entry computation, ROOT lines included) and one while."""
    assert sft_compile_v5e.optimized_hlo_counts(HLO) == (6, 1)


def test_an_unknown_form_is_refused_with_the_known_ones():
    with pytest.raises(SystemExit, match="unknown form.*fused_chunked.*fused64, fused_whole, plain"):
        sft_compile_v5e.main(["--forms", "fused64,fused_chunked"])
