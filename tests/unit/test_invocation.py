"""A message that names a command to run names one that works where the user is: the testbed's
command as this process was invoked (``invocation.py``), since a machine set up by ``scripts/go``
has no ``testbed`` on PATH and ``sudo`` resets PATH."""

from __future__ import annotations

import os
import sys

from testbed import invocation
from testbed.invocation import sudo_testbed


def test_the_console_script_is_named_as_it_was_typed():
    assert invocation.testbed_command(".venv/bin/testbed", "/x/python") == ".venv/bin/testbed"
    assert invocation.testbed_command("/opt/tb/.venv/bin/testbed", "/x/python") == "/opt/tb/.venv/bin/testbed"


def test_a_console_script_found_on_the_users_path_is_named_by_its_full_path(tmp_path, monkeypatch):
    script = tmp_path / "testbed"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin")
    assert invocation.testbed_command("testbed", "/x/python") == str(script)  # sudo's secure_path would not find it


def test_the_module_is_named_with_its_interpreter():
    main = os.path.join("/work", "testbed", "cli", "__main__.py")
    assert invocation.testbed_command(main, "/venv/bin/python") == "/venv/bin/python -m testbed.cli"


def test_a_script_using_the_package_gets_the_plain_name(monkeypatch):
    assert invocation.testbed_command("my_experiment.py", "/x/python") == "testbed"
    monkeypatch.setattr(sys, "argv", [".venv/bin/testbed", "run"])
    assert sudo_testbed("clean") == "sudo .venv/bin/testbed clean"
