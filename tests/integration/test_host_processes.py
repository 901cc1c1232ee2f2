"""Processes a user starts in hosts: a torch.distributed job over gloo reaches its peers in other
DCs without setting any interface itself (every host process gets GLOO_SOCKET_IFNAME and
NCCL_SOCKET_IFNAME naming the host's interface, unless the caller gives its own)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from testbed.run.backends import make_network
from testbed.spec.topology_file import load_topology

from .conftest import alive_with_argv

JOB = """
import datetime, sys, torch, torch.distributed as dist
dist.init_process_group(
    "gloo", init_method="tcp://{master}:29511", rank=int(sys.argv[1]), world_size=2,
    timeout=datetime.timedelta(seconds=30),
)
t = torch.tensor([float(sys.argv[1]) + 1])
dist.all_reduce(t)
print("sum", int(t.item()), flush=True)
dist.destroy_process_group()
"""


def test_a_users_gloo_job_spans_two_dcs(tmp_path, clean_machine):
    with make_network(load_topology("two_dc"), out_dir=tmp_path) as net:
        master = str(net.host("east-h0").ip)
        argv = [sys.executable, "-c", JOB.format(master=master)]
        procs = [
            net.popen(host, [*argv, str(rank)], stdout=subprocess.PIPE, text=True)
            for rank, host in enumerate(("east-h0", "west-h0"))
        ]
        outs = [p.communicate(timeout=90)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        assert all("sum 3" in out for out in outs), outs


def test_the_callers_own_interface_variables_win(tmp_path, clean_machine):
    with make_network(load_topology("two_dc"), out_dir=tmp_path) as net:
        show = ["sh", "-c", "echo $GLOO_SOCKET_IFNAME $NCCL_SOCKET_IFNAME"]
        assert net.run("east-h0", show).stdout.split() == ["eth0", "eth0"]
        proc = net.popen("east-h0", show, stdout=subprocess.PIPE, text=True, env={"GLOO_SOCKET_IFNAME": "eth0,eth0"})
        assert proc.communicate(timeout=30)[0].split() == ["eth0,eth0", "eth0"]


def test_a_command_that_outlives_its_timeout_is_ended_with_what_it_started(tmp_path, clean_machine):
    """``net.run`` past its timeout: the command and the child it left in the background (which
    holds its output's pipes) are killed, TimeoutExpired carries what it had printed, and the call
    returns at once rather than when the child would have ended."""
    with make_network(load_topology("two_dc"), out_dir=tmp_path) as net:
        t0 = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired) as e:
            net.run("east-h0", ["sh", "-c", "echo started; sleep 41.5 & sleep 41.5"], timeout_s=1)
        assert time.monotonic() - t0 < 10  # not the children's 41.5 s
        assert "started" in (e.value.output or "")
        assert alive_with_argv(["sleep", "41.5"]) == []
