"""One or two examples at the end of each command's ``--help``, every one runnable on a fresh
machine as written (shipped names only; ``tests/unit/test_cli_help.py`` parses each and checks the
names it gives). Keyed by the command's words after ``testbed`` ("" for ``testbed`` itself)."""

from __future__ import annotations

import argparse

EXAMPLES: dict[str, tuple[str, ...]] = {
    "": ("sudo testbed run", "testbed sim gpt3_175b_2dc"),
    "topo": ("testbed topo show three_dc", "sudo testbed topo check two_dc"),
    "topo show": ("testbed topo show three_dc", "testbed topo show four_dc --tc"),
    "topo check": (
        "sudo testbed topo check two_dc",
        "sudo testbed topo check three_dc --json --attempts 2",
        "sudo testbed topo check three_dc_day --profile --duration 30",
        "sudo testbed topo check two_dc_10g --dilation 10",
    ),
    "topo up": ("sudo testbed topo up two_dc",),
    "topo regions": (
        "testbed topo regions --list",
        "testbed topo regions aws:us-east-1 azure:westus gcp:europe-west4-a --scale 0.02 -o us_eu.yaml",
        "testbed topo regions aws:us-east-1 gcp:europe-west4-a azure:eastasia --unmeasured-rate 30mbit",
    ),
    "run": (
        "sudo testbed run",
        "sudo testbed run four_dc --policy atlas+bubbletea --iterations 16",
        "sudo testbed run four_dc --schedule zb-h1 --policy atlas",
        "sudo testbed run --dilation 4",
    ),
    "compare": ("sudo testbed compare --policies pp-fair,atlas --repeat 3", "sudo testbed compare sharing --ablation"),
    "plan": ("testbed plan", "testbed plan four_dc --grants", "testbed plan sharing_burst --grants"),
    "schedule": ("testbed schedule two_dc", "testbed schedule default --schedule zbv"),
    "analyze": ("testbed analyze results/RUN_FOLDER",),
    "launch": (
        "sudo testbed launch three_dc --mesh pp=3,dp=2 --stream -- examples/diloco.py",
        "sudo testbed launch sharing --policy pp-fair/sharing=fifo/striping=on -- examples/pipelining_gpt.py --dp 4",
    ),
    "link": ("sudo testbed link list", "sudo testbed link down east:west"),
    "link list": ("sudo testbed link list",),
    "link down": ("sudo testbed link down east:west",),
    "link up": ("sudo testbed link up east:west",),
    "link rate": ("sudo testbed link rate east:west 30mbit",),
    "clean": ("sudo testbed clean --dry-run", "sudo testbed clean"),
    "doctor": ("sudo testbed doctor",),
    "sim": (
        "testbed sim default --policies pp-fair,atlas",
        "testbed sim gpt3_175b_2dc --sweep wan_rate=100gbit,400gbit,delay=5ms,50ms",
    ),
}


def subcommands(parser: argparse.ArgumentParser, words: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command of ``parser`` by its words after ``testbed`` ("" for the parser itself), in
    the order they were added."""
    found = {words: parser}
    for action in parser._actions:  # argparse keeps its subparsers there and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= subcommands(sub, f"{words} {name}".strip())
    return found


def add_examples(parser: argparse.ArgumentParser, command: str = "testbed") -> argparse.ArgumentParser:
    """``parser`` with each command's ``EXAMPLES`` as the end of its ``--help`` (kept as written),
    ``testbed`` in them written as ``command`` (how the user runs it: ``invocation.testbed_command``)."""
    for words, sub in subcommands(parser).items():
        lines = [line.replace("testbed", command, 1) for line in EXAMPLES.get(words, ())]
        if lines:
            sub.epilog = "examples:\n" + "\n".join(f"  {line}" for line in lines)
            sub.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser
