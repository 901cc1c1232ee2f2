"""Each command's ``--help`` ends with examples (``cli/examples.py``), and every example works on a
fresh machine as written: it parses, and each file it names is a shipped one that loads."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from testbed.cli import build_parser, split_job
from testbed.cli.examples import EXAMPLES, subcommands
from testbed.spec.experiment_file import load_experiment
from testbed.spec.regions_table import load_regions_table
from testbed.spec.scenario_file import load_scenario, names_scenario
from testbed.spec.topology_file import load_topology

COMMANDS = subcommands(build_parser())
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("words", list(COMMANDS))
def test_every_commands_help_ends_with_examples(words, capsys):
    assert EXAMPLES.get(words), f"'testbed {words}' has no examples in cli/examples.py"
    with pytest.raises(SystemExit):
        build_parser().parse_args([*words.split(), "--help"])
    help_text = capsys.readouterr().out.rstrip()
    assert help_text.endswith(EXAMPLES[words][-1]) and "\nexamples:\n" in help_text


@pytest.mark.parametrize("line", sorted({line for lines in EXAMPLES.values() for line in lines}))
def test_every_example_parses_and_names_shipped_files(line):
    words = shlex.split(line)
    words = words[1:] if words[0] == "sudo" else words
    assert words[0] == "testbed"
    argv, job = split_job(words[1:])
    args = build_parser().parse_args(argv)
    if job is not None:  # testbed launch: the job's script ships with the checkout
        assert (REPO / job[0]).is_file(), job[0]
    if args.command == "topo" and args.topo_command == "regions":
        for region in args.regions:  # each one the regions table holds
            load_regions_table().check(region)
    elif args.command == "topo":
        load_topology(args.file)
    elif args.command == "sim" and args.experiment is not None and names_scenario(args.experiment):
        load_scenario(args.experiment)
    elif getattr(args, "experiment", None) is not None:
        load_experiment(args.experiment)


def test_no_example_is_for_a_command_that_does_not_exist():
    assert set(EXAMPLES) <= set(COMMANDS)
