import gguf
import numpy as np
import pytest

from tempax.models.gguf_io import dequantize_q4_1, dequantize_q8_0


def _f16_bytes(x: float) -> list[int]:
    return list(np.float16(x).tobytes())


def test_q4_1_block_by_hand():
    """d = 0.5, m = -1; byte j = 0x21 for j < 8 (low nibble 1, high 2) and 0xF0 after (low 0, high 15).
    Low nibbles -> values 0..15: 0.5*1 - 1 = -0.5 (j < 8), 0.5*0 - 1 = -1 (8 <= j < 16);
    high nibbles -> values 16..31: 0.5*2 - 1 = 0 (first 8), 0.5*15 - 1 = 6.5 (last 8)."""
    block = np.array(_f16_bytes(0.5) + _f16_bytes(-1.0) + [0x21] * 8 + [0xF0] * 8, np.uint8)
    want = [-0.5] * 8 + [-1.0] * 8 + [0.0] * 8 + [6.5] * 8
    np.testing.assert_array_equal(dequantize_q4_1(block, (1, 32)), np.array([want], np.float32))


def test_q8_0_block_by_hand():
    """d = 0.25, codes 0, 1, -2, 127, -128 then zeros: 0, 0.25, -0.5, 31.75, -32, 0, ..."""
    codes = np.array([0, 1, -2, 127, -128] + [0] * 27, np.int8).view(np.uint8)
    block = np.array(_f16_bytes(0.25) + list(codes), np.uint8)
    want = np.zeros(32, np.float32)
    want[:5] = [0, 0.25, -0.5, 31.75, -32]
    np.testing.assert_array_equal(dequantize_q8_0(block, (32,)), want)


@pytest.mark.parametrize("qtype, fast", [("Q4_1", dequantize_q4_1), ("Q8_0", dequantize_q8_0)])
def test_equal_to_the_gguf_package_bit_for_bit(qtype, fast):
    """A [48, 96] matrix quantised by the gguf package, dequantised by it and by tempax: identical float32."""
    w = (np.arange(48 * 96, dtype=np.float32).reshape(48, 96) % 37 - 18) / 7
    kind = gguf.GGMLQuantizationType[qtype]
    blocks = gguf.quants.quantize(w, kind)
    np.testing.assert_array_equal(fast(blocks.reshape(-1), w.shape), gguf.quants.dequantize(blocks, kind))
