"""The model's size and every formula derived from it, written once: parameters per block, FLOPs
per block, how blocks split into pipeline stages, and the bytes a stage boundary and a stage's
gradients move.

Pure data and arithmetic (no torch): the planner, the runner, BubbleTea's time model and the
simulator read these; ``testbed.model.gpt`` builds the network they describe.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from testbed.spec.fields import Field, FieldTable

#: bytes of one fp32 value (activations, gradients and parameters are fp32 throughout)
FP32_BYTES = 4


@dataclass(frozen=True)
class ModelConfig:
    """Model size. ``vocab`` 256: byte-level tokens. ``seq_len`` is the context length in tokens."""

    n_layers: int = 6
    d_model: int = 128
    n_heads: int = 4
    seq_len: int = 128
    vocab: int = 256
    #: bytes of one activation, gradient or parameter value at a stage boundary and in the gradient
    #: all-reduce: 4 (fp32) in the emulator's workers, 2 (bf16) in the simulator's scenarios
    value_bytes: int = FP32_BYTES

    @functools.cached_property  # read millions of times a scenario (BubbleTea's prefill model)
    def block_params(self) -> int:
        """Parameters of one transformer block: attention 4 d^2 + 4 d (qkv and projection), MLP
        8 d^2 + 5 d (d -> 4d -> d), two LayerNorms 4 d; 12 d^2 + 13 d in all."""
        d = self.d_model
        return 12 * d * d + 13 * d

    @property
    def embedding_params(self) -> int:
        """Token and position embedding tables (stage 0): (vocab + seq_len) x d."""
        return (self.vocab + self.seq_len) * self.d_model

    @functools.cached_property  # read millions of times a scenario (BubbleTea's prefill model)
    def head_params(self) -> int:
        """Final LayerNorm and the linear head over the vocabulary (last stage): 2 d + d x vocab + vocab."""
        return 2 * self.d_model + self.d_model * self.vocab + self.vocab

    def params(self) -> int:
        """Parameter count of the whole model (embeddings and head included)."""
        return self.embedding_params + self.n_layers * self.block_params + self.head_params

    def block_forward_flops(self, tokens: int, context: int | None = None) -> float:
        """Forward FLOPs of one block on ``tokens`` tokens that each attend over ``context`` positions
        (default ``seq_len``): 2 FLOPs per weight per token plus attention's 2 x context x d per
        token (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", table 1, per layer)."""
        ctx = self.seq_len if context is None else context
        return 2.0 * self.block_params * tokens + 2.0 * ctx * self.d_model * tokens

    def forward_flops(self, tokens: int) -> float:
        """Forward FLOPs of the whole model for ``tokens`` tokens: 2 x parameters x tokens plus
        attention's 2 x n_layers x seq_len x d_model per token (Kaplan et al. 2020, table 1)."""
        attention = self.n_layers * (self.block_forward_flops(tokens) - 2.0 * self.block_params * tokens)
        return 2.0 * self.params() * tokens + attention


#: an experiment's ``model`` (and ``bubbletea.model``): a GPT of identical blocks over byte-level
#: tokens (``vocab`` 256, not a field); defaults are ``ModelConfig``'s
MODEL_FIELDS = FieldTable(
    "experiment: model",
    "model",
    "The training model's shape: a GPT-style transformer of identical blocks over byte-level tokens "
    "(256 of them). `bubbletea.model` takes the same keys.",
    (
        Field(
            "n_layers",
            "int",
            "transformer blocks, split among the pipeline stages",
            "blocks",
            6,
            low=1,
            rule="under interleaved-1f1b and zbv, a multiple of `stages` x the virtual stages per worker",
        ),
        Field("d_model", "int", "width of the residual stream", default=128, low=1),
        Field("n_heads", "int", "attention heads", default=4, low=1, rule="divides `d_model`"),
        Field("seq_len", "int", "context length (a training sequence's tokens)", "tokens", 128, low=2),
    ),
)


def stage_layers(n_layers: int, n_stages: int, stage: int) -> range:
    """Blocks of ``stage``: contiguous, as even as possible, earlier stages take the remainder."""
    base, extra = divmod(n_layers, n_stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def largest_stage_blocks(n_layers: int, n_stages: int) -> int:
    """Blocks of the largest stage (``stage_layers``'s first): what sets the emulated GPU's time
    per block, a stage with fewer blocks being padded to the same targets."""
    return len(stage_layers(n_layers, n_stages, 0))


def stage_params(cfg: ModelConfig, n_stages: int, stage: int) -> int:
    """Parameters of one pipeline stage: its blocks, plus the embeddings on stage 0 and the final
    norm and head on the last stage."""
    n = len(stage_layers(cfg.n_layers, n_stages, stage)) * cfg.block_params
    if stage == 0:
        n += cfg.embedding_params
    if stage == n_stages - 1:
        n += cfg.head_params
    return n


def stage_param_bytes(cfg: ModelConfig, n_stages: int, stage: int) -> int:
    """Bytes of one stage's parameters (``value_bytes`` each): what its gradient all-reduce moves
    per iteration."""
    return cfg.value_bytes * stage_params(cfg, n_stages, stage)


def activation_shape(cfg: ModelConfig, microbatch_size: int) -> tuple[int, int, int]:
    """Shape of one microbatch's activations at a stage boundary: (microbatch, seq_len, d_model)."""
    return (microbatch_size, cfg.seq_len, cfg.d_model)


def activation_bytes(cfg: ModelConfig, microbatch_size: int) -> int:
    """Bytes of one microbatch's activations (or their gradients) at a stage boundary (``value_bytes``
    each)."""
    b, t, d = activation_shape(cfg, microbatch_size)
    return cfg.value_bytes * b * t * d


def prefill_flops(cfg: ModelConfig, start: int, chunk: int) -> float:
    """Forward FLOPs of prefilling positions start..start+chunk-1, as BubbleTea's
    ``inference.prefill_chunk`` computes them.

    After Kaplan et al. 2020 ("Scaling Laws for Neural Language Models", table 1), as
    ``ModelConfig.forward_flops`` does:
    - 2 FLOPs per parameter per token for the blocks (n_layers x (12 d^2 + 13 d) parameters); the
      embeddings are lookups (no FLOPs counted), and the final norm and head run on the chunk's last
      position only (2 x (d x vocab + vocab + 2 d) once);
    - attention: position p attends to p + 1 keys; the scores QK^T and the weighted sum AV each
      cost 2 x d_model FLOPs per key per layer, so 4 x n_layers x d_model x sum(p + 1).
    Kaplan's 2 x n_layers x n_ctx x d_model per token is this with the causal average of n_ctx / 2
    keys per query: prefill_flops(cfg, 0, L) counts 2 n_layers d L (L + 1) for attention, against
    forward_flops' 2 n_layers d L^2 at seq_len = L.
    Raises ValueError unless start >= 0 and chunk >= 1 (whole numbers).
    """
    if type(start) is not int or type(chunk) is not int or start < 0 or chunk < 1:  # bool is no integer here
        for name, value, low in (("start", start, 0), ("chunk", chunk, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: {value!r} is not an integer >= {low}")
    blocks = cfg.n_layers * cfg.block_params
    output = cfg.head_params
    attended = chunk * start + chunk * (chunk + 1) // 2  # sum of p + 1 over the chunk's positions
    return 2.0 * blocks * chunk + 2.0 * output + 4.0 * cfg.n_layers * cfg.d_model * attended


def prefill_chunk_estimate(cfg: ModelConfig, start: int, flops: float) -> float:
    """The chunk (tokens, fractional) whose prefill from position ``start`` takes ``flops``:
    ``prefill_flops`` is a quadratic in the chunk c, 2 n_layers d c^2 / 2 x 2 + (2 x blocks + 4
    n_layers d start + 2 n_layers d) c + 2 x head, solved for c (0 where even no token's head
    fits). An estimate: float rounding may put the answer a token off, so callers confirm it with
    ``prefill_flops`` itself."""
    a = 2.0 * cfg.n_layers * cfg.d_model
    b = 2.0 * cfg.n_layers * cfg.block_params + 4.0 * cfg.n_layers * cfg.d_model * start + a
    k = 2.0 * cfg.head_params - flops
    if k >= 0:
        return 0.0
    return (-b + math.sqrt(b * b - 4.0 * a * k)) / (2.0 * a)


def decode_flops(cfg: ModelConfig, position: int) -> float:
    """Forward FLOPs of one decode step for the token at ``position`` (0-based; it attends to
    position + 1 keys): ``prefill_flops(cfg, position, 1)``."""
    return prefill_flops(cfg, position, 1)
