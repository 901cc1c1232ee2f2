"""The emulated GPU: each forward and backward of a stage on one microbatch is padded to a target
duration, given in ms or derived from a reference model's FLOPs and a device's peak FLOP/s times
an efficiency; the backward takes twice the forward's FLOPs (Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters", section 5.1: 3x forward for forward plus
backward)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from testbed.errors import SpecError


@dataclass(frozen=True)
class DeviceModel:
    """A GPU's dense peak FLOP/s and the share a training step reaches (MFU), with their source."""

    name: str
    peak_tflops: float
    efficiency: float
    source: str


@dataclass(frozen=True)
class ComputeModel:
    """``mode``: ``padded`` (each operation padded to its target) or ``real`` (CPU speed, no padding)."""

    mode: str = "padded"
    forward_ms: float = 40.0
    backward_ms: float = 80.0
    device: DeviceModel | None = None
    reference_forward_tflop: float | None = None  # FLOPs of one stage's forward on one microbatch

    @property
    def padded(self) -> bool:
        """Whether operations are padded to their targets (an emulated GPU)."""
        return self.mode == "padded"


def resolve_compute(source: str, c: ComputeModel) -> ComputeModel:
    """Derive forward/backward targets from the device model when one is given."""
    if c.device is None:
        return c
    if c.reference_forward_tflop is None or c.reference_forward_tflop <= 0:
        raise SpecError(
            source,
            "compute.reference_forward_tflop",
            c.reference_forward_tflop,
            "is missing or not positive while compute.device is given",
            "give the FLOPs (in TFLOP) of one stage's forward pass on one microbatch",
        )
    fwd_ms = c.reference_forward_tflop / (c.device.peak_tflops * c.device.efficiency) * 1000
    return replace(c, forward_ms=fwd_ms, backward_ms=2 * fwd_ms)
