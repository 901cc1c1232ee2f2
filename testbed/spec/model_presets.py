"""Model shapes a scenario may name (``scenario.py``), GPT-style (``ModelConfig``: 12 d^2 + 13 d
parameters a block), with 16-bit values (bf16) at the stage boundaries and in the gradient
all-reduce, and where each shape comes from.

Pure data.
"""

from __future__ import annotations

from testbed.spec.model import ModelConfig

#: name -> (shape, source)
MODELS: dict[str, tuple[ModelConfig, str]] = {
    "gpt3-175b": (
        ModelConfig(n_layers=96, d_model=12288, n_heads=96, seq_len=2048, vocab=50257, value_bytes=2),
        "Brown et al. 2020, 'Language Models are Few-Shot Learners', table 2.1 (GPT-3 175B)",
    ),
    "gpt-70b": (
        ModelConfig(n_layers=80, d_model=8192, n_heads=64, seq_len=4096, vocab=32000, value_bytes=2),
        "Llama 2 70B's depth, width, heads, context and vocabulary (Touvron et al. 2023, table 1), as a GPT "
        "block: 65B parameters, without grouped-query attention or SwiGLU",
    ),
    "gpt-7b": (
        ModelConfig(n_layers=32, d_model=4096, n_heads=32, seq_len=4096, vocab=32000, value_bytes=2),
        "Llama 2 7B's depth, width, heads, context and vocabulary (Touvron et al. 2023, table 1), as a GPT block: 6.6B "
        "parameters",
    ),
}
