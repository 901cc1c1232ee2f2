"""Policies: how a run lays out its pipelines and uses the WAN, resolved once into a frozen value.

A policy stands for four independent parts (DESIGN.md section 1, items 1-5), which placement, the
planner, the runner and the report read from the :class:`Policy` value instead of comparing names
(the workers get what it means for them, resolved, in ``plan/worker_config.py``):

- ``placement``: ``file-order`` (PP across DCs in the topology file's order, DP inside a DC),
  ``largest-first`` (the same, DCs taken by available hosts, largest first), ``atlas`` (Atlas's DC
  selection: the set of DCs, in largest-first order, whose placement the cost model predicts to
  be fastest; ``plan/placement.py``'s ``select_dcs``) or ``replica-per-dc`` (each data-parallel replica's whole
  pipeline in one DC, so the gradient all-reduce crosses the WAN: the conventional layout);
- ``striping``: cross-DC transfers are split over several TCP connections;
- ``sharing``: ``tcp`` (the pipelines' flows share each WAN link as TCP does), ``fifo`` (Atlas's
  controller gives each link direction to one transfer at a time, earliest ready first) or
  ``planned`` (the same, in the order and with the pipeline offsets of a grant plan computed from
  the schedule, the compute times and the links: ``plan/grant_plan.py``);
- ``bubbletea``: prefill of inference requests fills the pipeline bubbles.

``+prefill-alone`` in place of ``+bubbletea`` measures what BubbleTea is set beside: the same
emulated GPUs (the policy's placement) serving prefill alone, with no training
(``bubbletea/alone.py``); ``compare`` divides a BubbleTea run's prefill by it.

A policy is named by a preset (``pp-fair``, ``dp-wan``, ``atlas``), optionally followed by parts
that replace the preset's (``/placement=P``, ``/striping=on|off``, ``/sharing=S``, in any order),
optionally followed by ``+bubbletea`` (or ``+prefill-alone``):
``pp-fair/placement=atlas/striping=on/sharing=fifo`` is Atlas without the grant plan.
``compare --ablation`` runs such a chain (``ABLATION``).
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.errors import TestbedError

PLACEMENTS = ("file-order", "largest-first", "atlas", "replica-per-dc")
SHARINGS = ("tcp", "fifo", "planned")
#: any policy followed by this suffix also fills the pipeline bubbles with prefill (BubbleTea)
BUBBLETEA_SUFFIX = "+bubbletea"
#: any policy followed by this suffix places its workers as the policy does and serves prefill alone
PREFILL_ALONE_SUFFIX = "+prefill-alone"
#: separates a preset from the parts that replace its own
PART_SEPARATOR = "/"


@dataclass(frozen=True)
class Policy:
    """One resolved policy. ``name`` is what the user wrote (``atlas+bubbletea``); ``base`` the
    network policy without the BubbleTea suffix; ``preset`` the named preset it starts from."""

    name: str
    base: str
    preset: str
    placement: str
    striping: bool
    sharing: str
    bubbletea: bool
    #: whether the workers train (False: ``+prefill-alone``, prefill served alone on the same GPUs)
    training: bool = True

    @property
    def grants(self) -> bool:
        """Whether Atlas's controller time-shares the WAN links (needs live shaping)."""
        return self.sharing in ("fifo", "planned")

    @property
    def pipeline_across_dcs(self) -> bool:
        """PP across DCs and DP inside each (every placement but ``replica-per-dc``)."""
        return self.placement != "replica-per-dc"

    def __str__(self) -> str:
        return self.name


#: the presets: (placement, striping, sharing)
BASE_POLICIES: dict[str, tuple[str, bool, str]] = {
    "pp-fair": ("file-order", False, "tcp"),
    "dp-wan": ("replica-per-dc", False, "tcp"),
    "atlas": ("atlas", True, "planned"),
}
#: the presets' names, in the order commands list them
POLICIES = tuple(BASE_POLICIES)
#: the policy of an experiment that names none
DEFAULT_POLICY = "pp-fair"
#: ``compare --ablation``: from pp-fair to atlas one part at a time (DESIGN.md section 1, item 4)
ABLATION = (
    "pp-fair",
    "pp-fair/placement=largest-first",
    "pp-fair/placement=atlas",
    "pp-fair/placement=atlas/striping=on",
    "pp-fair/placement=atlas/striping=on/sharing=fifo",
    "atlas",
)


class UnknownPolicy(TestbedError, ValueError):
    """A name that is no policy; ``args[0]`` says why and names the known parts (callers that read a
    file or an option turn it into a SpecError naming the field)."""


def known_policies() -> tuple[str, ...]:
    """The presets, then each with ``+bubbletea`` (any policy with parts is accepted too)."""
    return POLICIES + tuple(p + BUBBLETEA_SUFFIX for p in POLICIES)


def _usage() -> str:
    return (
        f"use a preset ({', '.join(POLICIES)}), optionally followed by /placement=({'|'.join(PLACEMENTS)}), "
        f"/striping=(on|off), /sharing=({'|'.join(SHARINGS)}), then optionally {BUBBLETEA_SUFFIX} "
        f"or {PREFILL_ALONE_SUFFIX}"
    )


def parse_policy(name: str) -> Policy:
    """The policy a name stands for. Raises UnknownPolicy."""
    base, bubbletea, training = name, False, True
    for suffix in (BUBBLETEA_SUFFIX, PREFILL_ALONE_SUFFIX):
        if name.endswith(suffix):
            base, bubbletea, training = name[: -len(suffix)], True, suffix == BUBBLETEA_SUFFIX
    preset, *parts = base.split(PART_SEPARATOR)
    if preset not in BASE_POLICIES:
        raise UnknownPolicy(_usage())
    placement, striping, sharing = BASE_POLICIES[preset]
    seen: set[str] = set()
    for part in parts:
        key, _, value = part.partition("=")
        if key in seen:
            raise UnknownPolicy(f"{key} is given twice in {name!r}: {_usage()}")
        seen.add(key)
        if key == "placement" and value in PLACEMENTS:
            placement = value
        elif key == "striping" and value in ("on", "off"):
            striping = value == "on"
        elif key == "sharing" and value in SHARINGS:
            sharing = value
        else:
            raise UnknownPolicy(f"{part!r} is no policy part: {_usage()}")
    if placement == "replica-per-dc" and (striping or sharing != "tcp"):
        raise UnknownPolicy(
            f"{name!r}: striping and grants act on stage-boundary transfers across the WAN, which "
            "replica-per-dc does not make; use them with a pipeline placement"
        )
    return Policy(name, base, preset, placement, striping, sharing, bubbletea, training)
