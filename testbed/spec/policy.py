"""Policies: how a run lays out its pipelines and uses the WAN, resolved once into a frozen value.

A policy name (``pp-fair``, ``dp-wan``, ``atlas``, each optionally followed by ``+bubbletea``)
stands for four independent choices (DESIGN.md section 1, items 1-5), which placement, the
planner, the runner and the report read from the :class:`Policy` value instead of comparing names
(the workers get what it means for them, resolved, in ``plan/worker_config.py``):

- ``placement``: ``file-order`` (PP across DCs in the topology file's order, DP inside a DC),
  ``largest-first`` (the same, DCs taken by available hosts, largest first: Atlas's DC selection)
  or ``replica-per-dc`` (each data-parallel replica's whole pipeline in one DC, so the gradient
  all-reduce crosses the WAN: the conventional layout);
- ``striping``: cross-DC transfers are split over several TCP connections;
- ``sharing``: ``tcp`` (the pipelines' flows share each WAN link as TCP does) or ``grants`` (Atlas's
  controller gives each link direction to one transfer at a time through live HTB changes);
- ``bubbletea``: prefill of inference requests fills the pipeline bubbles.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.errors import TestbedError

PLACEMENTS = ("file-order", "largest-first", "replica-per-dc")
SHARINGS = ("tcp", "grants")
#: any policy followed by this suffix also fills the pipeline bubbles with prefill (BubbleTea)
BUBBLETEA_SUFFIX = "+bubbletea"


@dataclass(frozen=True)
class Policy:
    """One resolved policy. ``name`` is what the user wrote (``atlas+bubbletea``); ``base`` the
    network policy without the BubbleTea suffix."""

    name: str
    base: str
    placement: str
    striping: bool
    sharing: str
    bubbletea: bool

    @property
    def grants(self) -> bool:
        """Whether Atlas's controller time-shares the WAN links (needs live shaping)."""
        return self.sharing == "grants"

    def __str__(self) -> str:
        return self.name


#: the network policies: (placement, striping, sharing)
BASE_POLICIES: dict[str, tuple[str, bool, str]] = {
    "pp-fair": ("file-order", False, "tcp"),
    "dp-wan": ("replica-per-dc", False, "tcp"),
    "atlas": ("largest-first", True, "grants"),
}
#: the network policies' names, in the order commands list them
POLICIES = tuple(BASE_POLICIES)
#: the policy of an experiment that names none
DEFAULT_POLICY = "pp-fair"


class UnknownPolicy(TestbedError, ValueError):
    """A name that is no policy; ``args[0]`` names the known ones (callers that read a file or an
    option turn it into a SpecError naming the field)."""


def known_policies() -> tuple[str, ...]:
    """Every policy name a run accepts: each network policy, then each with ``+bubbletea``."""
    return POLICIES + tuple(p + BUBBLETEA_SUFFIX for p in POLICIES)


def parse_policy(name: str) -> Policy:
    """The policy a name stands for. Raises UnknownPolicy."""
    base, bubbletea = (name[: -len(BUBBLETEA_SUFFIX)], True) if name.endswith(BUBBLETEA_SUFFIX) else (name, False)
    if base not in BASE_POLICIES:
        raise UnknownPolicy(f"use one of {', '.join(POLICIES)}, each optionally followed by {BUBBLETEA_SUFFIX}")
    placement, striping, sharing = BASE_POLICIES[base]
    return Policy(name, base, placement, striping, sharing, bubbletea)
