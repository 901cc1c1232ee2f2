"""The devices a scenario may train on (``scenario.py``): each GPU's dense 16-bit peak FLOP/s, the
share of it a large training run reaches on the FLOPs it executes (recomputation included:
Megatron's 49% counts the recomputed forward, hardware FLOP/s utilization; Llama 3's 38-43% MFU is
without recomputation, so the same measure) and its memory, with the source of every figure;
and this emulator's own padded device, so that a scenario can be set beside the emulator's runs.

Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.spec.compute import DeviceModel
from testbed.spec.model import ModelConfig

#: the default experiment's stage (``workloads/default.yaml``): 2 blocks of width 128 over a
#: microbatch of 2 x 64 tokens, padded to a 40 ms forward
_EMULATED_STAGE_FLOPS = 2 * ModelConfig(n_layers=6, d_model=128, n_heads=4, seq_len=64).block_forward_flops(2 * 64)
_EMULATED_FORWARD_S = 0.040


@dataclass(frozen=True)
class Device:
    """A device type: its compute model (``DeviceModel``: peak TFLOP/s, MFU, their source) and its
    memory (GB of 10^9 bytes; None: not modelled)."""

    model: DeviceModel
    memory_gb: float | None
    memory_source: str
    #: memory bandwidth (bytes per second), from ``memory_source``
    memory_bytes_per_s: float

    @property
    def flops(self) -> float:
        """FLOP/s the device sustains on a training step: peak x MFU."""
        return self.model.peak_tflops * 1e12 * self.model.efficiency

    @property
    def machine_balance(self) -> float:
        """FLOPs it sustains in the time it moves one byte to or from its memory (``flops`` over
        ``memory_bytes_per_s``): the ridge point of its roofline (Williams, Waterman and Patterson
        2009, "Roofline: an insightful visual performance model"), where work of fewer FLOPs a
        byte is bound by memory."""
        return self.flops / self.memory_bytes_per_s


_A100 = Device(
    DeviceModel(
        "A100 SXM4 80GB",
        312.0,
        0.49,
        "peak: NVIDIA A100 Tensor Core GPU datasheet (312 TFLOP/s dense BF16); MFU: Narayanan et al. 2021, "
        "'Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM', table 1 "
        "(GPT-3 175B on 1,536 A100s: 153 TFLOP/s per GPU, 49% of peak)",
    ),
    80.0,
    "NVIDIA A100 datasheet: 80 GB HBM2e, 2,039 GB/s",
    2.039e12,
)
_EMULATED_FLOPS = _EMULATED_STAGE_FLOPS / _EMULATED_FORWARD_S

DEVICES: dict[str, Device] = {
    "a100": _A100,
    "h100": Device(
        DeviceModel(
            "H100 SXM5 80GB",
            989.0,
            0.40,
            "peak: NVIDIA H100 Tensor Core GPU datasheet (989 TFLOP/s dense BF16); MFU: Dubey et al. 2024, "
            "'The Llama 3 Herd of Models', table 4 (38-43% BF16 MFU on 8,192 to 16,384 H100s)",
        ),
        80.0,
        "NVIDIA H100 datasheet: 80 GB HBM3, 3.35 TB/s",
        3.35e12,
    ),
    "emulated": Device(
        DeviceModel(
            "this emulator's padded GPU",
            _EMULATED_FLOPS / 1e12,
            1.0,
            "workloads/default.yaml: a stage's forward (2 blocks of width 128, 2 x 64 tokens) padded to 40 ms",
        ),
        None,
        "size not modelled (the emulator's budget is the experiment's gpu_memory_mb); bandwidth: "
        "the A100's machine balance (about 75 FLOPs a byte) at this device's FLOP/s, so that the "
        "padded GPU, slower than an A100 on every count alike, keeps its ratio of compute to memory "
        "traffic. The datasheet's bandwidth is a peak that decode does not quite reach, so decode is "
        "timed a little short",
        _EMULATED_FLOPS / _A100.machine_balance,
    ),
}


#: the emulated GPU's machine balance (FLOPs a byte, the A100's): what times a decode step, which
#: reads the blocks' and head's weights and each request's KV cache once
#: (``bubbletea.decisions.decode_step_seconds``)
EMULATED_MACHINE_BALANCE = DEVICES["emulated"].machine_balance
