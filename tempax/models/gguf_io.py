"""GGUF files (llama.cpp's format): metadata -> `ModelConfig`, tensors -> a tempax `Decoder`.

A GGUF file is a little-endian header (key/value metadata, then one info record per tensor: name, dims,
GGML type, offset) followed by aligned tensor data. `read_gguf_header` parses the header itself (it says why),
`load_gguf_tensor` dequantises one tensor at a time, and `load_gguf` undoes what llama.cpp's converter does to a
Hugging Face checkpoint (listed there).
"""

from __future__ import annotations

import math
import mmap
import os
import re
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from tempax.errors import CheckpointError
from tempax.models.config import ModelConfig, RopeConfig
from tempax.models.fused import split_fused_tensors

if TYPE_CHECKING:
    from tempax.models.decoder import Decoder

GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "smollm3", "olmo2", "phi3")
# Architectures whose converter permutes q/k rows to llama.cpp's interleaved rope (both are Llama's converter).
PERMUTED_ARCHITECTURES = ("llama", "smollm3")
# llama.cpp's SmolLM3 leaves out rotary embedding in every fourth layer, a step it reads from no key.
SMOLLM3_NOPE_STEP = 4


def gguf_architecture(cfg: ModelConfig) -> str:
    """llama.cpp's architecture name of a family: its own, except OLMo 3, which llama.cpp runs as olmo2 with
    sliding-window metadata."""
    return "olmo2" if cfg.family == "olmo3" else cfg.family


def smollm3_nope_layers(num_layers: int) -> tuple[int, ...]:
    """The layers llama.cpp's SmolLM3 runs without rotary embedding: every `SMOLLM3_NOPE_STEP`-th (3, 7, ...)."""
    return tuple(i for i in range(num_layers) if (i + 1) % SMOLLM3_NOPE_STEP == 0)
_GGUF_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32

# GGUF metadata value types (gguf spec): id -> struct format of one scalar.
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                   12: "<d"}
_NUMPY_TYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
                7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where one tensor lives in the file.

    Attributes:
      name: GGUF tensor name (`blk.3.attn_q.weight`).
      shape: numpy (row-major) shape, i.e. the GGUF dims reversed; [out, in] for a linear weight.
      ggml_type: a `gguf.GGMLQuantizationType` value.
      offset: absolute byte offset of the data in the file.
      nbytes: bytes of (possibly quantised) data.
    """

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        import gguf

        return gguf.GGMLQuantizationType(self.ggml_type).name

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class GGUFHeader:
    """The parsed header of a GGUF file: metadata and tensor infos, no tensor data."""

    path: str
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]
    file_size: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        """An architecture-scoped key: `get("block_count")` reads `<arch>.block_count`."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


# ------------------------------------------------------------------------------------------------------------
class _Cursor:
    """Sequential little-endian reads from a buffer; running past its end means the file is truncated."""

    def __init__(self, buf: Any, path: str):
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def _need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise CheckpointError(
                f"{self.path} is truncated or corrupt: reading {what} at byte {self.pos} needs {n} bytes but the "
                f"file has {self.size}. Download or convert it again."
            )

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self._need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        self._need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            etype = self.scalar("<I", what)
            count = self.scalar("<Q", what)
            if etype in _NUMPY_TYPES:
                dtype = np.dtype(_NUMPY_TYPES[etype])
                self._need(count * dtype.itemsize, what)
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
                self.pos += count * dtype.itemsize
                return arr
            if count > self.size - self.pos:  # every element takes at least one byte
                self._need(count, what)
            return [self.value(etype, what) for _ in range(count)]
        raise CheckpointError(f"{self.path} is corrupt: unknown GGUF value type {vtype} in {what}")


def is_gguf_file(path: str | os.PathLike) -> bool:
    """Whether `path` is a GGUF file, by its name (*.gguf) or, whatever it is called, its first four bytes
    (`tempax export --gguf` writes any file name a user asks for, and every command must read it back)."""
    path = os.fspath(path)
    if path.endswith(".gguf"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == _GGUF_MAGIC
    except OSError:
        return False


def read_gguf_header(path: str | os.PathLike) -> GGUFHeader:
    """Parses metadata and tensor infos (no tensor data); CheckpointError naming the file if it is not sound.

    We parse the header ourselves with `struct` over an mmap: `gguf.GGUFReader` builds two numpy views per string of
    the embedded vocabulary, which makes reading a header with a 100k-token vocabulary take seconds; this parser
    reads the strings in one pass (the figures: `docs/measurements/performance-history.md`, "Start-up").
    """
    import gguf

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"GGUF file not found: {path}")
    size = os.path.getsize(path)
    if size < 24:
        raise CheckpointError(f"{path} is truncated: {size} bytes is too short for a GGUF header")
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        if mm[:4] != _GGUF_MAGIC:
            raise CheckpointError(f"{path} is not a GGUF file (magic {bytes(mm[:4])!r}, expected b'GGUF')")
        cur = _Cursor(mm, path)
        cur.pos = 4
        version = cur.scalar("<I", "version")
        if version not in (2, 3):
            raise CheckpointError(
                f"{path}: GGUF version {version} is not supported (2 and 3 are; big-endian files are not)"
            )
        n_tensors = cur.scalar("<Q", "tensor count")
        n_kv = cur.scalar("<Q", "metadata count")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string("a metadata key")
            vtype = cur.scalar("<I", f"the type of {key!r}")
            metadata[key] = cur.value(vtype, f"metadata {key!r}")
        infos = []
        for _ in range(n_tensors):
            name = cur.string("a tensor name")
            n_dims = cur.scalar("<I", f"tensor {name!r}")
            if n_dims > 8:
                raise CheckpointError(f"{path} is corrupt: tensor {name!r} claims {n_dims} dimensions")
            dims = [cur.scalar("<Q", f"tensor {name!r}") for _ in range(n_dims)]
            ggml_type = cur.scalar("<I", f"tensor {name!r}")
            rel = cur.scalar("<Q", f"tensor {name!r}")
            infos.append((name, dims, ggml_type, rel))
        alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        data_start = -(-cur.pos // alignment) * alignment
    finally:
        mm.close()
    tensors: dict[str, GGUFTensorInfo] = {}
    for name, dims, ggml_type, rel in infos:
        try:
            qtype = gguf.GGMLQuantizationType(ggml_type)
        except ValueError:
            raise CheckpointError(f"{path}: tensor {name!r} has unknown GGML type {ggml_type}") from None
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n = math.prod(dims)
        if dims and dims[0] % block:
            raise CheckpointError(
                f"{path} is corrupt: tensor {name!r} has rows of {dims[0]}, not whole {qtype.name} blocks"
            )
        info = GGUFTensorInfo(name=name, shape=tuple(int(d) for d in reversed(dims)), ggml_type=int(qtype),
                              offset=data_start + rel, nbytes=n // block * type_size)
        if info.offset + info.nbytes > size:
            raise CheckpointError(
                f"{path} is truncated: tensor {name!r} needs bytes up to {info.offset + info.nbytes} but the file "
                f"has {size}. Download or convert it again."
            )
        tensors[name] = info
    return GGUFHeader(path=path, version=version, metadata=metadata, tensors=tensors, file_size=size)


def _header(source: str | os.PathLike | GGUFHeader) -> GGUFHeader:
    return source if isinstance(source, GGUFHeader) else read_gguf_header(source)


# ------------------------------------------------------------------------------------------------------------
def _one(header: GGUFHeader, key: str, value: Any) -> int:
    """Per-layer arrays (some converters write head counts per layer) must be uniform for our decoder."""
    if isinstance(value, (list, np.ndarray)):
        distinct = set(int(v) for v in value)
        if len(distinct) != 1:
            raise CheckpointError(
                f"{header.path}: {header.architecture}.{key} varies per layer ({sorted(distinct)}); tempax's decoder "
                "needs the same value in every layer."
            )
        value = distinct.pop()
    return int(value)


def _required(header: GGUFHeader, key: str) -> int:
    value = header.get(key)
    if value is None:
        raise CheckpointError(f"{header.path}: metadata key {header.architecture}.{key} is missing")
    return _one(header, key, value)


def _attention_layout(h: GGUFHeader, num_layers: int, hidden_per_head: int, head_dim: int,
                      rope: RopeConfig) -> dict[str, Any]:
    """The `ModelConfig` fields a GGUF architecture sets beyond the common ones: the family name, sliding and full
    layers with their window and local RoPE, Gemma's soft-caps and query scale."""
    arch = h.architecture
    layer_types: tuple[str, ...] = ()
    window = None
    rope_local = None
    attn_cap = final_cap = None
    query_scalar = None
    if arch == "gemma2":
        window = int(h.get("attention.sliding_window", 4096))
        layer_types = tuple("sliding" if i % 2 == 0 else "full" for i in range(num_layers))
        attn_cap = float(h.get("attn_logit_softcapping", 50.0))
        final_cap = float(h.get("final_logit_softcapping", 30.0))
    if arch == "gemma3":
        window = h.get("attention.sliding_window")
        if window:
            layer_types = _gemma3_layer_types(h, num_layers)
        rope_local = RopeConfig(theta=float(h.get("rope.freq_base_swa", 10000.0)))
        cap = h.get("final_logit_softcapping")
        final_cap = float(cap) if cap else None
    family = arch
    if arch == "olmo2" and h.get("attention.sliding_window"):  # OLMo 3: llama.cpp's olmo2 with windows
        family, window = "olmo3", h.get("attention.sliding_window")
        layer_types = _olmo3_layer_types(h, num_layers)
        rope_local = RopeConfig(theta=float(h.get("rope.freq_base_swa", rope.theta)))
    if arch == "phi3" and h.get("attention.sliding_window"):  # transformers windows every layer of a Phi-3
        window = h.get("attention.sliding_window")
        layer_types = ("sliding",) * num_layers
    if arch in ("gemma2", "gemma3"):
        scale = h.get("attention.scale")
        if scale:
            query_scalar = 1.0 / float(scale) ** 2
        elif num_layers in (46, 62):
            # The 27B models scale by (hidden / heads) ** -0.5 rather than head_dim ** -0.5; llama.cpp keys this off
            # the layer count too (46 layers: Gemma 2 27B, 62 layers: Gemma 3 27B).
            query_scalar = float(hidden_per_head)
        else:
            query_scalar = float(head_dim)
    return {"family": family, "layer_types": layer_types, "sliding_window": int(window) if layer_types else None,
            "rope_local": rope_local, "attn_logit_softcap": attn_cap, "final_logit_softcap": final_cap,
            "query_pre_attn_scalar": query_scalar}


def gguf_config(source: str | os.PathLike | GGUFHeader) -> ModelConfig:
    """The `ModelConfig` a GGUF file describes, from its metadata and tensor names only (no weights are read)."""
    h = _header(source)
    arch = h.architecture
    if arch not in GGUF_ARCHITECTURES:
        raise CheckpointError(
            f"{h.path}: unsupported architecture general.architecture={arch!r}. tempax reads GGUF files of: "
            f"{', '.join(GGUF_ARCHITECTURES)}."
        )
    if "token_embd.weight" not in h.tensors:
        raise CheckpointError(f"{h.path}: no token_embd.weight tensor; the file is incomplete or not a language model")
    gemma = arch.startswith("gemma")
    num_layers = _required(h, "block_count")
    hidden = _required(h, "embedding_length")
    heads = _required(h, "attention.head_count")
    kv_heads = _one(h, "attention.head_count_kv", h.get("attention.head_count_kv", heads))
    head_dim = int(h.get("attention.key_length") or hidden // heads)
    value_dim = int(h.get("attention.value_length") or head_dim)
    rope_dim = int(h.get("rope.dimension_count") or head_dim)
    if value_dim != head_dim or (rope_dim != head_dim and arch != "phi3"):
        raise CheckpointError(
            f"{h.path}: key_length={head_dim}, value_length={value_dim}, rope.dimension_count={rope_dim}; tempax "
            "supports only equal key/value head sizes with RoPE over the whole head (partial rotary: phi3 only)."
        )
    rope = _rope(h, head_dim)
    tensors = h.tensors
    post_norms = arch in ("gemma2", "gemma3", "olmo2")  # OLMo: after the blocks only (pre_norms below)
    md = h.metadata
    return ModelConfig(
        **_attention_layout(h, num_layers, hidden // heads, head_dim, rope),
        vocab_size=tensors["token_embd.weight"].shape[0],
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_required(h, "feed_forward_length"),
        rope=rope,
        rms_norm_eps=float(h.get("attention.layer_norm_rms_epsilon", 1e-6 if gemma else 1e-5)),
        norm_offset=gemma,
        embed_scale=gemma,
        activation="gelu_tanh" if gemma else "silu",
        tie_word_embeddings="output.weight" not in tensors,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        o_bias="blk.0.attn_output.bias" in tensors,
        mlp_bias="blk.0.ffn_up.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        post_norms=post_norms,
        max_position_embeddings=int(h.get("context_length", 2048)),
        bos_token_id=_opt_int(md.get("tokenizer.ggml.bos_token_id")),
        eos_token_id=_opt_int(md.get("tokenizer.ggml.eos_token_id")),
        pad_token_id=_opt_int(md.get("tokenizer.ggml.padding_token_id")),
        nope_layers=smollm3_nope_layers(num_layers) if arch == "smollm3" else (),
        pre_norms=arch != "olmo2",
        qk_norm_across_heads=arch == "olmo2",
        partial_rotary_factor=rope_dim / head_dim,
    )


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _gemma3_layer_types(h: GGUFHeader, num_layers: int) -> tuple[str, ...]:
    pattern = h.get("attention.sliding_window_pattern")
    if isinstance(pattern, (list, np.ndarray)):  # newer converters: one bool per layer, true = sliding
        if len(pattern) != num_layers:
            raise CheckpointError(
                f"{h.path}: sliding_window_pattern has {len(pattern)} entries for {num_layers} layers"
            )
        return tuple("sliding" if bool(p) else "full" for p in pattern)
    n = int(pattern) if pattern is not None else 6  # llama.cpp's Gemma 3 default: 5 local layers, then 1 global
    if n <= 1:
        return ()
    return tuple("full" if (i + 1) % n == 0 else "sliding" for i in range(num_layers))


def _olmo3_layer_types(h: GGUFHeader, num_layers: int) -> tuple[str, ...]:
    """OLMo 3's layer kinds from llama.cpp's sliding_window_pattern: one bool per layer (true = sliding, what the
    converter writes) or a period n (every n-th layer full); absent, llama.cpp's default period 4."""
    pattern = h.get("attention.sliding_window_pattern")
    if isinstance(pattern, (list, np.ndarray)):
        if len(pattern) != num_layers:
            raise CheckpointError(f"{h.path}: sliding_window_pattern has {len(pattern)} entries for {num_layers} "
                                  "layers")
        return tuple("sliding" if bool(p) else "full" for p in pattern)
    n = int(pattern) if pattern is not None else 4
    return tuple("full" if (i + 1) % n == 0 else "sliding" for i in range(num_layers))


def _rope(h: GGUFHeader, head_dim: int) -> RopeConfig:
    theta = float(h.get("rope.freq_base", 10000.0))
    kind = h.get("rope.scaling.type")
    if "rope_freqs.weight" in h.tensors:
        factors = load_gguf_tensor(h, "rope_freqs.weight").astype(np.float64)
        return _llama3_rope_from_factors(factors, theta=theta, head_dim=head_dim, source=h.path)
    if "rope_factors_long.weight" in h.tensors:
        return _longrope(h, theta)
    if kind in (None, "none") or (kind == "linear" and float(h.get("rope.scaling.factor", 1.0)) == 1.0):
        return RopeConfig(theta=theta)
    if kind == "linear":
        return RopeConfig(theta=theta, scaling="linear", factor=float(h.get("rope.scaling.factor")))
    raise CheckpointError(f"{h.path}: RoPE scaling type {kind!r} is not supported (none, linear, llama3)")


def _longrope(h: GGUFHeader, theta: float) -> RopeConfig:
    """Phi-3's LongRoPE from llama.cpp's `rope_factors_long` / `rope_factors_short` tensors, its original context and
    its cos/sin factor; the extension factor is the context length over the original (as the converter computes
    it). The cos/sin factor is kept only where it differs from LongRoPE's default for that factor."""
    original = h.get("rope.scaling.original_context_length")
    if original is None:
        raise CheckpointError(f"{h.path}: rope_factors_long without {h.architecture}.rope.scaling."
                              "original_context_length; the LongRoPE context is unknown")
    factor = float(h.get("context_length", original)) / float(original)
    stored = h.get("rope.scaling.attn_factor")
    default = math.sqrt(1 + math.log(factor) / math.log(float(original))) if factor > 1 else 1.0
    attention_factor = None if stored is None or math.isclose(stored, default, rel_tol=1e-6) else float(stored)
    return RopeConfig(theta=theta, scaling="longrope", factor=factor, original_max_position_embeddings=int(original),
                      attention_factor=attention_factor,
                      short_factor=tuple(float(f) for f in load_gguf_tensor(h, "rope_factors_short.weight")),
                      long_factor=tuple(float(f) for f in load_gguf_tensor(h, "rope_factors_long.weight")))


def llama3_rope_factors(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """llama.cpp's `rope_freqs` for a Llama 3 rope: the divisor of each base frequency (1 = unscaled).

    With wavelength w_i = 2*pi / theta^(-2i/d) and s_i = (L_orig / w_i - low) / (high - low):
    divisor = 1 where w_i < L_orig / high, `factor` where w_i > L_orig / low, else 1 / ((1 - s_i) / factor + s_i).
    """
    inv = 1.0 / rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv
    old, factor = rope.original_max_position_embeddings, rope.factor
    low, high = rope.low_freq_factor, rope.high_freq_factor
    smooth = (old / wavelen - low) / (high - low)
    mixed = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old / high, 1.0, np.where(wavelen > old / low, factor, mixed))


def _llama3_rope_from_factors(factors: np.ndarray, *, theta: float, head_dim: int, source: str) -> RopeConfig:
    """Llama 3 rope numbers that reproduce llama.cpp's per-frequency divisors exactly.

    The band mix s(u) = (L_orig * u - low) / (high - low) is linear in u = 1 / wavelength, clipped to [0, 1]
    (0 = divide by `factor`, 1 = unscaled). Only that line matters: scaling (L_orig, low, high) together leaves
    the rope unchanged. So we read `factor` (the largest divisor), recover s at every frequency, fit the line
    through the unclipped points (or place it between the clipped ones when fewer than two are unclipped), and
    express it with an integer L_orig. The result is checked against the stored divisors.
    """
    if factors.shape != (head_dim // 2,):
        raise CheckpointError(f"{source}: rope_freqs has shape {factors.shape}, expected ({head_dim // 2},)")
    factor = float(factors.max())
    if factor <= 1.0 + 1e-6:
        return RopeConfig(theta=theta)
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    u = inv / (2 * math.pi)
    s = (1.0 / factors - 1.0 / factor) / (1.0 - 1.0 / factor)
    tol = 1e-5
    mid = (s > tol) & (s < 1 - tol)
    low_u = u[s <= tol]  # fully scaled (long wavelengths)
    high_u = u[s >= 1 - tol]  # unscaled (short wavelengths)
    if mid.sum() >= 2:
        slope, intercept = np.polyfit(u[mid], s[mid], 1)
    elif mid.sum() == 1:
        u0, s0 = float(u[mid][0]), float(s[mid][0])
        bounds = []
        if low_u.size:
            bounds.append(s0 / (u0 - low_u.max()))
        if high_u.size:
            bounds.append((1 - s0) / (high_u.min() - u0))
        slope = max(bounds) if bounds else s0 / u0
        intercept = s0 - slope * u0
    elif low_u.size and high_u.size:
        u_lo, u_hi = float(low_u.max()), float(high_u.min())
        slope = 1.0 / (u_hi - u_lo)
        intercept = -slope * u_lo
    else:
        raise CheckpointError(f"{source}: rope_freqs scales every frequency alike; not a Llama 3 rope")
    if slope <= 0 or intercept >= 0:
        raise CheckpointError(f"{source}: rope_freqs does not follow Llama 3 frequency-band scaling")
    # slope = L / (high - low), intercept = -low / (high - low); pick L integral and solve for low, high.
    old = max(1, round(-slope / intercept))
    span = old / slope
    low = -intercept * span
    rope = RopeConfig(theta=theta, scaling="llama3", factor=factor, low_freq_factor=float(low),
                      high_freq_factor=float(low + span), original_max_position_embeddings=int(old))
    if not np.allclose(llama3_rope_factors(rope, head_dim), factors, rtol=1e-4, atol=0):
        raise CheckpointError(f"{source}: rope_freqs does not follow Llama 3 frequency-band scaling")
    return rope


# ------------------------------------------------------------------------------------------------------------
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_ATTN = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
         "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
         "attn_norm": "input_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
         "post_attention_norm": "post_attention_layernorm"}
# Phi-3's fused projections: q, k and v rows in attn_qkv; gate then up rows in ffn_up.
_PHI3_FUSED = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
# Tensors llama.cpp writes that carry nothing the decoder needs (or that the config already absorbed).
_IGNORED = re.compile(r"^(rope_freqs\.weight|rope_factors_(long|short)\.weight"
                      r"|blk\.\d+\.attn_rot_embd(\.weight)?)$")


def gguf_to_hf_name(name: str, cfg: ModelConfig) -> str | None:
    """Hugging Face tensor name of a GGUF tensor; None for tensors we deliberately skip."""
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    if _IGNORED.match(name):
        return None
    m = _BLOCK.match(name)
    if m:
        i, part, kind = m.groups()
        if part == "ffn_norm":
            # Llama/Qwen call the pre-MLP norm post_attention_layernorm; Gemma 2/3 call it pre_feedforward_layernorm.
            module = "pre_feedforward_layernorm" if cfg.post_norms else "post_attention_layernorm"
        elif cfg.family == "phi3" and part in _PHI3_FUSED:
            module = _PHI3_FUSED[part]  # split into its parts by `tempax.models.fused.split_fused_tensors`
        else:
            module = _ATTN.get(part)
        if module is not None:
            return f"model.layers.{i}.{module}.{kind}"
    raise CheckpointError(
        f"GGUF tensor {name!r} is not understood by tempax (a {cfg.family} model has token_embd, blk.N.attn_*, "
        "blk.N.ffn_*, *_norm and output tensors)"
    )


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's per-head row permutation of q_proj/k_proj (interleaved -> rotate-half order).

    llama.cpp: `w.reshape(n, 2, d // 2, ...).swapaxes(1, 2)` moves row h*d + t*(d/2) + j to h*d + 2j + t.
    Works on weights [n*d, in] and biases [n*d].
    """
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's permutation itself (rotate-half -> interleaved); tests write GGUF files with it."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize_q4_1(raw: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """GGML's Q4_1 blocks to float32: each block of 32 values is 20 bytes, a float16 scale d, a float16 minimum m
    and 16 bytes of 4-bit codes q; value j is d * (low nibble of byte j) + m for j < 16 and d * (high nibble of
    byte j - 16) + m for the rest (ggml-quants.c `dequantize_row_q4_1`).

    The whole tensor in a few array passes; the gguf package's version (equal bit for bit, tests check it)
    works 16 rows at a time through Python, which costs more CPU time per tensor (`docs/measurements/
    performance-history.md`, "Start-up").
    """
    blocks = np.asarray(raw, np.uint8).reshape(-1, 20)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [blocks, 1]
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    codes = blocks[:, 4:]
    out = np.empty((blocks.shape[0], 2, 16), np.float32)
    np.bitwise_and(codes, 0x0F, out=out[:, 0], casting="unsafe")
    np.right_shift(codes, 4, out=out[:, 1], casting="unsafe")
    out = out.reshape(-1, 32)
    out *= d
    out += m
    return out.reshape(tuple(shape))


def dequantize_q8_0(raw: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """GGML's Q8_0 blocks to float32: each block of 32 values is 34 bytes, a float16 scale d and 32 int8 codes q;
    value j is d * q[j] (ggml-quants.c `dequantize_row_q8_0`). Whole-tensor, as `dequantize_q4_1`."""
    blocks = np.asarray(raw, np.uint8).reshape(-1, 34)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [blocks, 1]
    out = blocks[:, 2:].view(np.int8).astype(np.float32)
    out *= d
    return out.reshape(tuple(shape))


_FAST_DEQUANTIZE = {"Q4_1": dequantize_q4_1, "Q8_0": dequantize_q8_0}


def load_gguf_tensor(header: GGUFHeader, name: str) -> np.ndarray:
    """One tensor, dequantised to float32 in numpy layout ([out, in] for linears), from its own memory map.

    Tensor data is dequantised by `gguf.quants.dequantize` (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the
    K-quants, IQ*, TQ*, MXFP4...), one tensor at a time from its own memory map, so host memory peaks at the model
    plus one float32 tensor.
    """
    import gguf

    info = header.tensors[name]
    qtype = gguf.GGMLQuantizationType(info.ggml_type)
    if info.nbytes == 0:
        return np.zeros(info.shape, np.float32)
    raw = np.memmap(header.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.nbytes,))
    if qtype == gguf.GGMLQuantizationType.F32:
        return np.array(raw.view(np.float32).reshape(info.shape))
    if qtype == gguf.GGMLQuantizationType.F16:
        return raw.view(np.float16).reshape(info.shape).astype(np.float32)
    if qtype.name in _FAST_DEQUANTIZE:
        return _FAST_DEQUANTIZE[qtype.name](raw, info.shape)
    try:
        blocks = raw.reshape(gguf.quants.quant_shape_to_byte_shape(info.shape, qtype))
        return np.asarray(gguf.quants.dequantize(blocks, qtype), dtype=np.float32)
    except NotImplementedError:
        raise CheckpointError(
            f"{header.path}: tensor {name!r} is stored as {qtype.name}, which the gguf package cannot dequantise"
        ) from None


def iter_gguf_tensors(header: GGUFHeader, cfg: ModelConfig) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    """(Hugging Face name, loader) pairs for `tempax.models.weights.fill_params`, with llama.cpp's edits undone."""
    permuted = header.architecture in PERMUTED_ARCHITECTURES
    norm_plus_one = header.architecture.startswith("gemma")
    yield from split_fused_tensors(_gguf_tensor_loaders(header, cfg, permuted, norm_plus_one), cfg)


def _gguf_tensor_loaders(header: GGUFHeader, cfg: ModelConfig, permuted: bool,
                         norm_plus_one: bool) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    for name in header.tensors:
        hf_name = gguf_to_hf_name(name, cfg)
        if hf_name is None:
            continue

        def load(name: str = name) -> np.ndarray:
            w = load_gguf_tensor(header, name)
            if permuted and (".attn_q." in name or ".attn_k." in name):
                w = unpermute_qk(w, cfg.num_heads if ".attn_q." in name else cfg.num_kv_heads)
            if norm_plus_one and name.endswith("norm.weight"):
                w = w - 1.0
            return w

        yield hf_name, load


def load_gguf(
    path: str | os.PathLike, *, param_dtype: str | None = None, dtype: str | None = None, progress: bool = True
) -> "Decoder":
    """Loads a GGUF file into a tempax `Decoder` (weights dequantised to `param_dtype`, default float32).

    What llama.cpp's converter (`convert_hf_to_gguf.py`) does to a Hugging Face checkpoint, and how we undo it:
      * Dims are stored fastest-varying first (`ne[0]` = columns), so a GGUF [in, out] is numpy/HF [out, in].
      * Llama-architecture files (Llama, Mistral, SmolLM; also `smollm3`) have their q_proj/k_proj rows (and biases)
        permuted per head from rotate-half RoPE order to the interleaved (GPT-J) order llama.cpp's "normal" RoPE uses:
        `w.reshape(n_head, 2, head_dim // 2, ...).swapaxes(1, 2)`. We apply the inverse,
        `w.reshape(n_head, head_dim // 2, 2, ...).swapaxes(1, 2)`. Qwen, Gemma, OLMo 2 and Phi-3 use NeoX RoPE and are
        not permuted.
      * Gemma, Gemma 2 and Gemma 3 norm weights are stored as `w + 1` (llama.cpp multiplies by the weight, HF by
        `1 + w`); every `*norm.weight` tensor of those architectures gets 1 subtracted.
      * Llama 3 RoPE scaling is stored as a `rope_freqs.weight` tensor of per-frequency divisors instead of the four
        config numbers; `_llama3_rope_from_factors` finds numbers that reproduce the divisors (see there).
      * A tied LM head is simply absent (`output.weight` missing).
      * Phi-3's q/k/v and gate/up projections are fused (`attn_qkv`, and `ffn_up` holding gate then up rows), as in
        its Hugging Face files; they are split on reading (`tempax.models.fused`).
      * OLMo 3 is llama.cpp's `olmo2` with a sliding window and a per-layer pattern; SmolLM3's NoPE layers are every
        fourth, fixed by llama.cpp rather than stored.
    """
    # The weight modules import JAX; reading a GGUF header or config (the command line does) does not need it.
    from tempax.models.hf_io import _progress_bar
    from tempax.models import weight_cache
    from tempax.models.weights import abstract_model, fill_params

    cached = weight_cache.cache_dir()
    # A missing file gets `read_gguf_header`'s error below, not one from the cache's key.
    use_cache = cached and os.path.isfile(path)
    entry = weight_cache.entry_dir(cached, path, f"{param_dtype}|{dtype}") if use_cache else None
    if entry is not None and (cfg := weight_cache.cached_config(entry)) is not None:
        model = abstract_model(cfg)  # the header is not read at all: parsing its vocabulary is most of its cost
        if weight_cache.fill_from_cache(model, entry):
            return model
    header = read_gguf_header(path)
    cfg = gguf_config(header)
    changes = {k: v for k, v in (("param_dtype", param_dtype), ("dtype", dtype)) if v}
    cfg = cfg.replace(**changes) if changes else cfg
    total = sum(4 * t.num_elements for t in header.tensors.values())
    model = abstract_model(cfg)
    bar = _progress_bar(total, f"loading {os.path.basename(header.path)}", progress)
    try:
        fill_params(model, iter_gguf_tensors(header, cfg), source=header.path, progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    if entry is not None:
        weight_cache.store(model, entry)
    return model
