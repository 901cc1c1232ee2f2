"""The emulated GPU: each forward and backward of a stage on one microbatch is padded to a target
duration, given in ms or derived from a reference model's FLOPs and a device's peak FLOP/s times
an efficiency; the backward takes twice the forward's FLOPs (Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters", section 5.1: 3x forward for forward plus
backward).

The optimizer step is padded too, to ``optimizer_ms`` (by default one forward target of the
largest stage). Why one forward: mixed-precision Adam keeps 16 bytes per parameter (Rajbhandari et
al. 2020, "ZeRO", section 3.1) and its step moves about 28 (reads the fp16 gradient, the fp32
master weight and two moments; writes those three and the fp16 weight), 14 ps per parameter at an
A100 80 GB SXM's 2.0 TB/s; a forward's 2 FLOPs per parameter and token take 12.8 ps per parameter over a
microbatch of 1,000 tokens at 156 TFLOP/s (312 x 0.5). One forward is that order, a round figure
rather than a measurement; give ``optimizer_ms`` for another."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from testbed.errors import SpecError
from testbed.spec.fields import REQUIRED, Field, FieldTable


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
    optimizer_ms: float | None = None  # the optimizer step's target; None: one forward target
    # run by this testbed's workers (the model adds their hand-off between two operations,
    # ``plan/handoff.py``); False for a scenario's real devices and a launched job's own processes.
    # Not a file field.
    emulated: bool = True

    @property
    def padded(self) -> bool:
        """Whether operations are padded to their targets (an emulated GPU)."""
        return self.mode == "padded"

    @property
    def optimizer_target_ms(self) -> float:
        """The optimizer step's padding target (ms): ``optimizer_ms``, or one forward target (the
        module doc says why)."""
        return self.optimizer_ms if self.optimizer_ms is not None else self.forward_ms


#: an experiment's ``compute``: defaults are ``ComputeModel``'s
COMPUTE_FIELDS = FieldTable(
    "experiment: compute",
    "compute",
    "The emulated GPU: each forward and backward of a stage on one microbatch is padded to a target "
    "duration, given in ms or derived from a device's peak FLOP/s and efficiency.",
    (
        Field(
            "mode",
            "choice",
            "`padded`: every operation padded to its target (an emulated GPU); `real`: the CPU's own speed",
            default="padded",
            choices=("padded", "real"),
        ),
        Field(
            "forward_ms",
            "number",
            "a stage's forward on one microbatch",
            "ms",
            40.0,
            low=0,
            low_open=True,
            fix="give targets above 0 ms",
        ),
        Field(
            "backward_ms",
            "number",
            "a stage's backward on one microbatch",
            "ms",
            80.0,
            low=0,
            low_open=True,
            fix="give targets above 0 ms",
        ),
        Field(
            "optimizer_ms",
            "number",
            "a stage's optimizer step",
            "ms",
            default_text="one forward target",
            low=0,
            low_open=True,
            fix="give a target above 0 ms, or leave it out for one forward target",
        ),
        Field(
            "device",
            "section",
            "derive `forward_ms` and `backward_ms` (twice the forward) from a device's FLOP/s",
            default_text="none: the targets as given",
            table="experiment: compute.device",
        ),
        Field(
            "reference_forward_tflop",
            "number",
            "FLOPs of one stage's forward pass on one microbatch, for `device`",
            "TFLOP",
            low=0,
            low_open=True,
            rule="required with `device`",
        ),
    ),
)
#: ``compute.device``: every field required
DEVICE_FIELDS = FieldTable(
    "experiment: compute.device",
    "compute.device",
    "A GPU's dense peak and the share of it a training step reaches (MFU), with their source.",
    (
        Field("name", "text", "the device's name", default=REQUIRED),
        Field(
            "peak_tflops",
            "number",
            "dense peak",
            "TFLOP/s",
            REQUIRED,
            low=0,
            low_open=True,
            fix="give the device's dense peak in TFLOP/s, e.g. 312",
        ),
        Field(
            "efficiency",
            "number",
            "the share of peak a training step reaches (MFU)",
            default=REQUIRED,
            low=0,
            low_open=True,
            high=1,
            fix="give the reached share of peak (MFU), e.g. 0.4",
        ),
        Field("source", "text", "where the figures come from", default=REQUIRED),
    ),
)


def compute_from_dict(d: dict[str, Any]) -> ComputeModel:
    """A ``ComputeModel`` from its ``asdict`` record (a run folder's ``config.json``; a record
    written before ``optimizer_ms`` existed gets its default, keys it does not know are ignored).
    Raises TypeError for a device record of another form."""
    known = {f.name for f in fields(ComputeModel)}
    d = {k: v for k, v in d.items() if k in known}
    if d.get("device") is not None:
        d["device"] = DeviceModel(**d["device"])
    return ComputeModel(**d)


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
