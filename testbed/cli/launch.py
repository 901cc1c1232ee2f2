"""``testbed launch``: a user's own torchrun job in the emulated hosts (``run/user_job.py``)."""

from __future__ import annotations

import time
from pathlib import Path

from testbed.cli.common import root_preamble
from testbed.errors import SpecError
from testbed.run.records import discard_unused_out
from testbed.spec.experiment import Experiment
from testbed.spec.experiment_file import load_experiment
from testbed.spec.mesh import Mesh, parse_mesh, read_placement
from testbed.spec.policy import parse_policy
from testbed.spec.specfile import read_spec_file
from testbed.spec.topology import TopologySpec
from testbed.spec.topology_file import DEFAULT_TOPOLOGY, TOPOLOGY_DIR, load_topology


def job_target(name: str | None) -> tuple[TopologySpec, Experiment | None]:
    """The topology ``name`` gives (a topology, or an experiment: its topology) and the experiment,
    if it is one (its stages x replicas are the default mesh, its per-connection window caps the
    hosts' socket buffers). Raises SpecError as the loaders do."""
    if name is None:
        return load_topology(DEFAULT_TOPOLOGY), None
    if (TOPOLOGY_DIR / f"{name}.yaml").exists():
        return load_topology(name), None
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        _, data = read_spec_file(path, TOPOLOGY_DIR, "topology")
        if isinstance(data, dict) and "dcs" in data:
            return load_topology(path), None
    exp = load_experiment(name)
    return exp.topology_spec, exp


def cmd_launch(args) -> int:
    from testbed.run.user_job import Job, JobError, launch_job

    if not args.job:
        raise SpecError(
            "testbed launch",
            "SCRIPT",
            "(none)",
            "is missing",
            "give the job after --: testbed launch three_dc --mesh pp=3,dp=2 -- examples/NAME.py [ARGS]",
        )
    if args.backend != "netns":
        raise SpecError(
            "--backend",
            "(option)",
            args.backend,
            "cannot start a launched job yet: each node runs in its own mount and UTS namespaces beside its host's "
            "network namespace on this machine, with its own /etc/hosts, which only the netns backend builds",
            "leave --backend out (netns); for several machines, run the testbed's own workers: testbed run "
            "--backend remote",
        )
    topo, exp = job_target(args.target)
    mesh = parse_mesh(args.mesh) if args.mesh else None
    hosts = None
    if args.placement is not None:
        path, data = read_spec_file(args.placement, Path.cwd(), "placement")
        placed, hosts = read_placement(data, str(path), topo)
        if mesh is not None and mesh != placed:
            raise SpecError(
                "--mesh", "--mesh", args.mesh, f"differs from --placement's {placed.pp} stages x {placed.dp} "
                "replicas", "leave --mesh out: the file gives the mesh",
            )  # fmt: skip
        mesh = placed
    if mesh is None and exp is not None:
        mesh = Mesh(exp.stages, exp.replicas)
    if mesh is None:
        raise SpecError(
            "--mesh", "--mesh", "(none)", "is needed for a topology", "give e.g. --mesh pp=3,dp=2, or --placement FILE"
        )
    job = Job(
        topo,
        mesh,
        parse_policy(args.policy or "pp-fair"),
        Path(args.job[0]),
        tuple(args.job[1:]),
        stripes=args.connections,
        warmup=args.warmup,
        experiment=exp,
        rendezvous=args.rendezvous,
        hosts=hosts,
    )
    root_preamble("testbed launch")
    out = args.out or Path("results") / f"job-{job.script.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    existed = out.exists()
    try:
        summary = launch_job(
            job,
            out,
            progress=lambda line: print(line, flush=True),
            stream=(lambda line: print(line, flush=True)) if args.stream else None,
            timeout_s=args.timeout,
            delay_mechanism=args.delay_mechanism,
            join_timeout_s=args.join_timeout,
            outage_timeout_s=args.outage_timeout,
        )
    except SpecError:
        discard_unused_out(out, created=not existed)  # refused before building: no folder left
        raise
    except JobError as e:
        print(f"testbed launch: {e}; the job's folder: {out}", flush=True)
        return e.status
    wan = ", ".join(f"{k} {v['bytes'] / 1e6:.2f} MB" for k, v in summary["wan"].items()) or "no WAN traffic"
    print(f"WAN: {wan}")
    if summary.get("training"):
        t = summary["training"]
        bubbles = ", ".join(f"stage {s} {b:.0%}" for s, b in t["bubble_fraction"].items())
        print(
            f"iteration time {t['iteration_time_s']['mean']:.3f} s (mean of {t['iterations_measured']}, "
            f"after {t['warmup_iterations']} warm-up); bubbles {bubbles}"
        )
    if summary.get("hook"):
        h = summary["hook"]
        per = f"{h['per_transfer_us']:.0f} us per transfer" if h["per_transfer_us"] is not None else "no transfer"
        print(
            f"Atlas hook ({summary['sharing']}): {h['transfers']} transfers, {per}, {h['share_of_job']:.3%} of the "
            f"{h['share_over']} at most"
        )
    print(f"job folder {out}")
    return 0
