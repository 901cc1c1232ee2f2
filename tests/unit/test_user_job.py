"""A user's own job (``testbed launch``) before anything is built: the mesh and its errors, the
job's arguments after ``--``, its placement and what it refuses, one node's command, its
environment and the script's status as torchrun reports it (tests/integration/test_launch.py
runs jobs)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import replace

import pytest

from testbed.cli import split_job
from testbed.errors import SpecError
from testbed.net.management import management_addresses
from testbed.run.job_grants import managed_pairs
from testbed.run.job_nodes import HOOK_MODULE, HOST_VARIABLES, NODE_SHELL, job_env, node_argv, script_status
from testbed.run.user_job import Job, check_job
from testbed.spec.mesh import Mesh, parse_mesh, read_placement
from testbed.spec.policy import parse_policy
from testbed.spec.topology_file import load_topology
from testbed.trace.job import JOB_DIR_ENV
from testbed.train.job_hook import CONTROL_ENV, STRIPES_ENV


def test_a_mesh_names_stages_and_replicas():
    assert parse_mesh("pp=3,dp=2") == Mesh(3, 2) and parse_mesh("dp=2, pp=3").size == 6
    assert parse_mesh("pp=4") == Mesh(4, 1) and parse_mesh("dp=2") == Mesh(1, 2)


@pytest.mark.parametrize(
    "text, problem",
    [("tp=2", "is not pp=N or dp=N"), ("pp=2,pp=3", "is given twice"), ("pp=0", "whole number"), ("pp=x", "whole")],
)
def test_a_bad_mesh_is_named(text, problem):
    with pytest.raises(SpecError, match=problem) as e:
        parse_mesh(text)
    assert e.value.field.startswith("--mesh")


def test_the_job_is_what_follows_the_double_dash_of_launch_only():
    assert split_job(["launch", "two_dc", "--", "job.py", "--lr", "3"]) == (
        ["launch", "two_dc"],
        ["job.py", "--lr", "3"],
    )
    assert split_job(["run", "default"]) == (["run", "default"], None)
    assert split_job(["launch", "two_dc"]) == (["launch", "two_dc"], None)


def test_ranks_are_placed_as_the_testbeds_own_workers(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("")
    workers = check_job(Job(load_topology("three_dc"), Mesh(3, 2), parse_policy("pp-fair"), script))
    assert [(w.rank, w.stage, w.replica, w.dc) for w in workers] == [
        (0, 0, 0, "east"), (1, 0, 1, "east"), (2, 1, 0, "central"), (3, 1, 1, "central"),
        (4, 2, 0, "west"), (5, 2, 1, "west"),
    ]  # fmt: skip


def test_what_a_job_cannot_take_is_refused(tmp_path):
    script = tmp_path / "job.py"
    topo = load_topology("two_dc")
    with pytest.raises(SpecError, match="is not a file"):
        check_job(Job(topo, Mesh(2, 1), parse_policy("pp-fair"), script))
    script.write_text("")
    for policy in ("atlas", "pp-fair/placement=atlas", "pp-fair+bubbletea", "pp-fair+prefill-alone"):
        with pytest.raises(SpecError, match="is not applied to a launched job"):
            check_job(Job(topo, Mesh(2, 1), parse_policy(policy), script))
    with pytest.raises(SpecError, match="is not 2..16") as e:
        check_job(Job(topo, Mesh(2, 1), parse_policy("pp-fair/striping=on"), script, stripes=1))
    assert e.value.source == "--connections"
    with pytest.raises(SpecError, match="do not fit topology two_dc") as e:
        check_job(Job(topo, Mesh(3, 3), parse_policy("pp-fair"), script))
    assert e.value.source == "--mesh"


def test_atlas_sharing_and_striping_run_the_job_under_the_hook_on_the_pipelines_cross_dc_pairs(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("")
    topo = load_topology("three_dc")
    plain = Job(topo, Mesh(3, 2), parse_policy("pp-fair"), script)
    assert not plain.hooked
    for policy in ("pp-fair/sharing=fifo", "pp-fair/striping=on", "pp-fair/sharing=planned/striping=on"):
        job = Job(topo, Mesh(3, 2), parse_policy(policy), script)
        assert job.hooked
        workers = check_job(job)
    # neighbours of one pipeline in different DCs, both ways; never across replicas
    assert managed_pairs(job.topology, job.mesh.pp, workers) == [
        (0, 2),
        (1, 3),
        (2, 0),
        (2, 4),
        (3, 1),
        (3, 5),
        (4, 2),
        (5, 3),
    ]


def test_a_node_runs_torchrun_in_its_own_mount_and_uts_namespaces():
    argv = node_argv("/py", "/out/hosts", "west-h1", 3, 4, "10.0.0.2", "/job.py", ["--lr", "3"])
    assert argv[:7] == ["unshare", "--mount", "--uts", "--", "sh", "-c", NODE_SHELL]
    assert argv[7:10] == ["sh", "/out/hosts", "west-h1"]
    torchrun = argv[10:]
    assert torchrun[:3] == ["/py", "-m", "torch.distributed.run"]
    assert torchrun[-5:] == ["-m", HOOK_MODULE, "/job.py", "--lr", "3"]  # under the hook, as python job.py
    flags = dict(zip(torchrun[3:-5:2], torchrun[4:-5:2]))
    assert flags == {
        "--nnodes": "4",
        "--nproc-per-node": "1",
        "--node-rank": "3",
        "--master-addr": "10.0.0.2",
        "--master-port": "29500",
        "--max-restarts": "0",
    }


def test_the_jobs_environment_has_none_of_this_machines_torch_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("MASTER_ADDR", "192.0.2.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "wlan0")
    env = job_env(tmp_path)
    assert not set(HOST_VARIABLES) & set(env) and env["OMP_NUM_THREADS"] == "1" and "PYTHONPATH" in env
    assert env[JOB_DIR_ENV] == str(tmp_path.resolve()) and CONTROL_ENV not in env and STRIPES_ENV not in env
    hooked = job_env(tmp_path, tmp_path / "c.sock", 4)
    assert hooked[CONTROL_ENV] == str(tmp_path / "c.sock") and hooked[STRIPES_ENV] == "4"


def test_the_scripts_status_is_read_from_torchruns_report(tmp_path):
    log = tmp_path / "rank1.log"
    log.write_text("...\n  exitcode  : 3 (pid: 17478)\n")
    assert script_status(log) == 3
    log.write_text("Traceback: something else\n")
    assert script_status(log) is None
    assert script_status(tmp_path / "missing.log") is None


def test_the_management_network_takes_addresses_apart_from_the_topologys():
    topo = load_topology("two_dc")
    assert management_addresses(topo, ["east-h0", "west-h0"]) == {"east-h0": "198.18.0.1", "west-h0": "198.18.0.2"}
    clash = replace(topo, dc_pool=ipaddress.IPv4Network("198.18.0.0/16"))
    with pytest.raises(SpecError, match="overlaps the management network") as e:
        management_addresses(clash, ["east-h0"])
    assert e.value.field == "addressing.dc_pool"


def test_a_path_the_rendezvous_cannot_take_is_refused(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("")
    with pytest.raises(SpecError, match="is not a path"):
        check_job(Job(load_topology("two_dc"), Mesh(2, 1), parse_policy("pp-fair"), script, rendezvous="lan"))


def test_a_placement_file_gives_the_mesh_and_each_ranks_host(tmp_path):
    topo = load_topology("three_dc")
    entries = [
        {"stage": 0, "replica": 0, "host": "west-h1"}, {"stage": 0, "replica": 1, "host": "west-h0"},
        {"stage": 1, "replica": 0, "host": "east-h0"}, {"stage": 1, "replica": 1, "host": "east-h1"},
    ]  # fmt: skip
    mesh, hosts = read_placement(entries, "p.yaml", topo)
    assert mesh == Mesh(2, 2) and hosts[(0, 0)] == "west-h1"
    script = tmp_path / "job.py"
    script.write_text("")
    job = Job(topo, mesh, parse_policy("pp-fair"), script, hosts=hosts)
    workers = check_job(job)
    assert [(w.rank, w.host, w.dc) for w in workers] == [
        (0, "west-h1", "west"), (1, "west-h0", "west"), (2, "east-h0", "east"), (3, "east-h1", "east"),
    ]  # fmt: skip
    # a job's own job.json places the next one the same way
    again = {
        "workers": [
            {"rank": w.rank, "stage": w.stage, "replica": w.replica, "host": w.host, "dc": w.dc} for w in workers
        ]
    }
    assert read_placement(again, "job.json", topo) == (mesh, hosts)
    with pytest.raises(SpecError, match="places the ranks, and so does --placement"):
        check_job(Job(topo, mesh, parse_policy("pp-fair/placement=largest-first"), script, hosts=hosts))


@pytest.mark.parametrize(
    "entries, field, problem",
    [
        ({"stage": 0}, "workers", "is not a list of workers"),
        ([{"stage": 0, "replica": 0}], "workers[0]", "is not {stage, replica, host}"),
        ([{"stage": 0, "replica": 0, "host": "east-h0", "gpu": 1}], "workers[0].gpu", "is not a field"),
        ([{"stage": -1, "replica": 0, "host": "east-h0"}], "workers[0].stage", "whole number"),
        ([{"stage": 0, "replica": 0, "host": "east-h9"}], "workers[0].host", "is not a host of topology three_dc"),
        ([{"stage": 0, "replica": 0, "host": "east-h0"}, {"stage": 1, "replica": 0, "host": "east-h0"}],
         "workers[1].host", "is also workers[0]'s"),
        ([{"stage": 0, "replica": 0, "host": "east-h0"}, {"stage": 0, "replica": 0, "host": "east-h1"}],
         "workers[1]", "is given twice"),
        ([{"stage": 1, "replica": 0, "host": "east-h0"}], "workers", "is missing"),
        ([{"stage": 0, "replica": 0, "host": "east-h0", "dc": "west"}], "workers[0].dc", "is not east-h0's DC"),
        ([{"stage": 0, "replica": 0, "host": "east-h0", "rank": 3}], "workers[0].rank", "is not stage x 1 + replica"),
    ],
)  # fmt: skip
def test_a_bad_placement_file_is_named(entries, field, problem):
    with pytest.raises(SpecError, match=re.escape(problem)) as e:
        read_placement(entries, "p.yaml", load_topology("three_dc"))
    assert e.value.field == field
