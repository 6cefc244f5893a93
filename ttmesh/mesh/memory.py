"""The symmetric DRAM reservation for collectives (``LIBTT_SYMMETRIC_DRAM_MB``), and a server's
memory budget per chip.

TT-NN collectives write to their peers at the address of their own buffer, and separate
processes do not allocate in the same order, so every rank reserves the same region of each
chip's DRAM when it starts. The value must therefore be equal on every rank, and it must leave
room for the job itself: at least 1 GiB of the smallest selected chip's DRAM stays free.
"""

from __future__ import annotations

from typing import Any

from ttmesh.dataclass import dataclass
from ttmesh.errors import bad_input

DEFAULT_MB = 2048
KEEP_FREE_MB = 1024


def plan(requested_mb: int | None, dram_mb: list[int]) -> int:
    """The reservation for a job on chips with ``dram_mb`` each; bad input raises exit 2."""
    mb = DEFAULT_MB if requested_mb is None else requested_mb
    if isinstance(mb, bool) or not isinstance(mb, int) or mb <= 0:
        raise bad_input(
            f"--symmetric-dram-mb {requested_mb}: must be a positive whole number of MB",
            f"the default is {DEFAULT_MB}",
        )
    smallest = min(dram_mb) if dram_mb else 0
    if smallest and mb > smallest - KEEP_FREE_MB:
        raise bad_input(
            f"--symmetric-dram-mb {mb}: the smallest selected chip has {smallest} MB of DRAM and "
            f"at least {KEEP_FREE_MB} MB must stay free",
            f"use at most {smallest - KEEP_FREE_MB}",
        )
    return mb


# --------------------------------------------------------------------------- the memory budget

DTYPE_BYTES = {
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "float32": 4, "fp32": 4, "float": 4,
    "fp8_e5m2": 1, "fp8_e4m3": 1, "fp8": 1, "int8": 1,
}  # fmt: skip
GB = 1e9


@dataclass(frozen=True)
class ModelShape:
    """What a Hugging Face ``config.json`` says about a decoder's size."""

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    dtype: str  # torch_dtype

    @property
    def parameters(self) -> int:
        """Embedding, LM head (unless tied), attention and a gated MLP per layer, norms."""
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        norms = 2 * self.hidden + 2 * self.head_dim  # two RMSNorms; q/k norms (Qwen3)
        per_layer = q + kv + o + mlp + norms
        embed = self.vocab * self.hidden
        return self.layers * per_layer + embed * (1 if self.tied else 2) + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.layers * self.kv_heads * self.head_dim * 2 * dtype_bytes


def model_shape(config: dict[str, Any]) -> ModelShape:
    """A Hugging Face decoder config; KeyError/ValueError when it is not one."""
    text = config.get("text_config") or config  # multimodal wrappers keep the LM inside
    heads = int(text["num_attention_heads"])
    hidden = int(text["hidden_size"])
    return ModelShape(
        layers=int(text["num_hidden_layers"]),
        hidden=hidden,
        intermediate=int(text["intermediate_size"]),
        vocab=int(text["vocab_size"]),
        heads=heads,
        kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads),
        tied=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        dtype=str(text.get("torch_dtype") or config.get("torch_dtype") or "bfloat16"),
    )


@dataclass
class Budget:
    """One chip's DRAM for a server: weights and KV cache split over the chips, the symmetric
    reservation, against the chip's DRAM times the server's static memory fraction."""

    chips: int
    chip_gb: float
    fraction: float
    parameters: int
    weights_gb: float  # per chip
    kv_gb: float  # per chip, for max_total_tokens
    max_total_tokens: int | None
    symmetric_gb: float
    dtype: str
    kv_dtype: str

    @property
    def static_gb(self) -> float:
        return self.chip_gb * self.fraction

    @property
    def left_gb(self) -> float:
        """Static memory left after weights, reservation and the KV cache."""
        return self.static_gb - self.weights_gb - self.symmetric_gb - self.kv_gb

    @property
    def weights_fit(self) -> bool:
        return self.weights_gb + self.symmetric_gb <= self.chip_gb

    @property
    def room_gb(self) -> float:
        """What the static fraction leaves for the KV cache once the weights and the
        reservation are in (negative: the weights alone need more than it leaves)."""
        return self.static_gb - self.weights_gb - self.symmetric_gb

    def fraction_needed(self, step: float = 0.05) -> float:
        """The smallest static fraction (a multiple of ``step``) that holds the weights, the
        reservation and the KV cache on these chips."""
        import math

        need = (self.weights_gb + self.symmetric_gb + self.kv_gb) / self.chip_gb
        return round(max(step, math.ceil(need / step - 1e-9) * step), 2)

    def chips_needed(self, usable: float = 0.9) -> int:
        """The fewest chips whose DRAM (``usable`` of it) holds the weights and reservation."""
        import math

        total = self.weights_gb * self.chips
        per_chip = self.chip_gb * usable - self.symmetric_gb
        return max(self.chips + 1, math.ceil(total / per_chip)) if per_chip > 0 else self.chips + 1

    @property
    def kv_fits(self) -> bool:
        room = self.static_gb - self.weights_gb - self.symmetric_gb
        return room > 0 and room >= self.kv_gb

    def rows(self) -> list[tuple[str, str]]:
        tokens = self.max_total_tokens
        return [
            ("chips", str(self.chips)),
            ("DRAM per chip", f"{self.chip_gb:.1f} GB"),
            ("static fraction", f"{self.fraction:g} ({self.static_gb:.1f} GB per chip)"),
            ("weights", f"{self.parameters / 1e9:.2f} B parameters in {self.dtype}: "
                        f"{self.weights_gb * self.chips:.1f} GB, {self.weights_gb:.1f} GB per chip"),
            ("symmetric reservation", f"{self.symmetric_gb:.1f} GB per chip"),
            ("KV cache", f"{self.kv_gb:.2f} GB per chip for {tokens} tokens ({self.kv_dtype})"
                         if tokens else "not sized (no --max-total-tokens)"),
            ("left", f"{self.left_gb:.1f} GB per chip"),
        ]  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "chips": self.chips,
            "chip_gb": round(self.chip_gb, 3),
            "fraction": self.fraction,
            "static_gb": round(self.static_gb, 3),
            "parameters": self.parameters,
            "dtype": self.dtype,
            "weights_gb": round(self.weights_gb * self.chips, 3),
            "weights_gb_per_chip": round(self.weights_gb, 3),
            "kv_dtype": self.kv_dtype,
            "max_total_tokens": self.max_total_tokens,
            "kv_gb_per_chip": round(self.kv_gb, 3),
            "symmetric_gb_per_chip": round(self.symmetric_gb, 3),
            "left_gb_per_chip": round(self.left_gb, 3),
            "weights_fit": self.weights_fit,
            "kv_fits": self.kv_fits,
        }


def _bytes(dtype: str, fallback: str) -> tuple[str, int]:
    name = (dtype or "auto").lower()
    if name == "auto":
        name = fallback.lower()
    return name, DTYPE_BYTES.get(name, DTYPE_BYTES.get(name.split("_")[0], 2))


def budget(
    shape: ModelShape,
    *,
    chips: int,
    chip_mb: int,
    fraction: float,
    dtype: str = "auto",
    kv_dtype: str = "auto",
    max_total_tokens: int | None = None,
    symmetric_mb: int = 0,
) -> Budget:
    """Weights split over ``chips``; the KV cache split by KV heads (at least one per chip)."""
    dtype_name, dtype_bytes = _bytes(dtype, shape.dtype)
    kv_name, kv_bytes = _bytes(kv_dtype, dtype_name)
    weights = shape.parameters * dtype_bytes / GB / chips
    kv_split = min(chips, shape.kv_heads)  # KV heads are split, replicated beyond that
    kv = shape.kv_bytes_per_token(kv_bytes) * (max_total_tokens or 0) / GB / kv_split
    return Budget(
        chips=chips,
        chip_gb=chip_mb * 1024 * 1024 / GB,
        fraction=fraction,
        parameters=shape.parameters,
        weights_gb=weights,
        kv_gb=kv,
        max_total_tokens=max_total_tokens,
        symmetric_gb=symmetric_mb * 1024 * 1024 / GB,
        dtype=dtype_name,
        kv_dtype=kv_name,
    )
