"""A scenario: training at the paper's scale for the simulator (``testbed sim SCENARIO``), described
as data: a real model shape, a device type, GPUs per DC, the tensor-parallel degree, the WAN
between the DCs, the global batch, the microbatch size and the schedule. Files are read by
``scenario_file.py``.

The simulator sees one device per pipeline-stage replica: a tensor-parallel group of
``tensor_parallel`` GPUs inside a node (Narayanan et al. 2021, section 3.2: tensor parallelism
inside a node, pipeline parallelism across nodes), computing a stage ``tensor_parallel`` times
faster than one GPU, holding ``1 / tensor_parallel`` of its memory, and reaching the DC's fabric
through its GPUs' NICs together. ``experiment`` turns the scenario into the ``Experiment`` the
simulator runs (a topology whose hosts are these devices), so that the schedules, placement, grant
plan and cost model are the emulator's own.

Pure data.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace

from testbed.spec.bubbletea import BubbleTeaSpec
from testbed.spec.compute import ComputeModel
from testbed.spec.devices import DEVICES, Device
from testbed.spec.experiment import Experiment
from testbed.spec.model import ModelConfig, largest_stage_blocks
from testbed.spec.model_presets import MODELS
from testbed.spec.policy import DEFAULT_POLICY
from testbed.spec.topology import DCSpec, LinkSpec, TopologySpec

#: address pools that hold a scenario's DCs of up to 65,534 devices (never built: the addresses
#: only satisfy the topology's checks)
SCENARIO_DC_POOL = "172.16.0.0/12"
SCENARIO_DC_PREFIX = 16
#: the TCP congestion control of a scenario's hosts: one whose connections send a window per round
#: trip (the scenario's ``tcp_window_bytes``), as the paper's model has them; not this machine's
#: default, which the emulated hosts inherit (under BBR a pipeline's connection paces each
#: message at its own estimate: ``plan/connections.app_limited_message_s``)
SCENARIO_CONGESTION = "cubic"


@dataclass(frozen=True)
class Scenario:
    """A validated scenario (see the module doc). ``dcs``: (name, GPUs) per DC; ``links``: the WAN;
    ``gpu_nic_rate_bps``: each GPU's link to its DC's fabric (bit/s); ``tcp_window_bytes``: the
    most one TCP connection keeps in flight on the WAN (None: no per-connection limit);
    ``gpu_memory_gb``: each GPU's memory (GB, 10^9 bytes; None: unchecked); ``recompute``: full
    activation recomputation (only each block's input is kept; the backward recomputes the
    forward)."""

    name: str
    model: ModelConfig
    model_name: str
    device_name: str
    dcs: tuple[tuple[str, int], ...]
    links: tuple[LinkSpec, ...]
    tensor_parallel: int
    stages: int
    global_batch: int
    microbatch_size: int = 1
    schedule: str = "1f1b"
    virtual_stages: int | None = None
    recompute: bool = False
    gpu_memory_gb: float | None = None
    gpu_nic_rate_bps: int = 200 * 10**9
    tcp_window_bytes: int | None = None
    #: BubbleTea (``<policy>+bubbletea``): the model served in the bubbles, a copy on every device
    #: (split over its tensor-parallel GPUs), and the requests per second (Azure-fitted stream)
    inference_model: ModelConfig = MODELS["gpt-7b"][0]
    inference_model_name: str = "gpt-7b"
    request_rate: float = 100.0
    description: str = ""
    source: str = "<memory>"

    @property
    def device(self) -> Device:
        return DEVICES[self.device_name]

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.dcs)

    @property
    def replicas(self) -> int:
        """Data-parallel replicas: the devices (tensor-parallel groups) over the stages."""
        return self.gpus // self.tensor_parallel // self.stages

    @property
    def microbatches(self) -> int:
        """Microbatches per replica and iteration: the global batch over replicas x microbatch size."""
        return self.global_batch // (self.replicas * self.microbatch_size)

    @property
    def atlas_floor_share(self) -> float:
        """The share of a WAN link each held pipeline keeps under Atlas's grants: the experiments'
        default (``Experiment.atlas_floor_share``), but at most half of 1 / replicas, so that the
        held pipelines together keep at most half the link and the granted one has the rest (an
        experiment's floor must stay below 1 / replicas; 20 replicas or more would reach it)."""
        return min(Experiment.atlas_floor_share, 0.5 / self.replicas)

    def stage_forward_s(self) -> float:
        """One forward of the largest stage on one microbatch (s): its blocks' FLOPs
        (``ModelConfig.block_forward_flops``; the embedding and the head are left out) over the
        tensor-parallel group's sustained FLOP/s (``Device.flops``)."""
        blocks = largest_stage_blocks(self.model.n_layers, self.stages)
        flops = blocks * self.model.block_forward_flops(self.microbatch_size * self.model.seq_len)
        return flops / (self.tensor_parallel * self.device.flops)

    def backward_factor(self) -> float:
        """A backward's time over its forward's: 2 (twice the forward's FLOPs, Narayanan et al. 2021,
        section 5.1), 3 with full recomputation (the forward again)."""
        return 3.0 if self.recompute else 2.0

    def topology(self) -> TopologySpec:
        """The scenario's DCs as a topology whose hosts are its devices (tensor-parallel groups),
        each on an access link of its GPUs' NICs together."""
        nic = self.gpu_nic_rate_bps * self.tensor_parallel
        return TopologySpec(
            self.name,
            tuple(DCSpec(name, gpus // self.tensor_parallel, intra_rate_bps=nic) for name, gpus in self.dcs),
            self.links,
            source=self.source,
            dc_pool=ipaddress.IPv4Network(SCENARIO_DC_POOL),
            dc_prefix_len=SCENARIO_DC_PREFIX,
            description=self.description,
            tcp_congestion=SCENARIO_CONGESTION,
        )

    def experiment(self, policy: str = DEFAULT_POLICY) -> Experiment:
        """The experiment the simulator runs for ``policy``: the scenario's devices as hosts, its
        compute targets (``stage_forward_s``), its window on the WAN."""
        fwd_ms = self.stage_forward_s() * 1000
        return Experiment(
            name=self.name,
            topology=self.name,
            topology_spec=self.topology(),
            schedule=self.schedule,
            virtual_stages=self.virtual_stages,
            iterations=BubbleTeaSpec().profile_iterations + 2,  # not simulated: BubbleTea's checks need them
            warmup_iterations=0,
            stages=self.stages,
            replicas=self.replicas,
            microbatches=self.microbatches,
            microbatch_size=self.microbatch_size,
            model=self.model,
            compute=ComputeModel(forward_ms=fwd_ms, backward_ms=fwd_ms * self.backward_factor(), emulated=False),
            policy=policy,  # type: ignore[arg-type]  # resolved in __post_init__
            wan_window_bytes=self.tcp_window_bytes,
            atlas_floor_share=self.atlas_floor_share,
            # the served model's own context bounds the prompts (clipped to leave room for the output)
            bubbletea=BubbleTeaSpec(
                model=self.inference_model,
                request_rate=self.request_rate,
                max_prompt_tokens=self.inference_model.seq_len - BubbleTeaSpec.max_output_tokens,
            ),
            source=self.source,
        )

    def with_wan(self, rate_bps: int | None = None, delay_us: int | None = None) -> Scenario:
        """The scenario with every WAN link at ``rate_bps`` and/or ``delay_us`` (one way): a sweep's
        point (``sim/sweep.py``)."""
        links = tuple(
            replace(k, rate_bps=rate_bps or k.rate_bps, delay_us=k.delay_us if delay_us is None else delay_us)
            for k in self.links
        )
        return replace(self, links=links)
