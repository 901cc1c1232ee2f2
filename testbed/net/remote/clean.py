"""Finishing a dead ``--backend remote`` run on its machines (``testbed clean``, or the teardown of a
run whose agent died): fetch the traces left there, let each machine's own registry remove what a
killed agent left, and delete the run's folder there."""

from __future__ import annotations

from pathlib import Path

from testbed.errors import RemoteError
from testbed.net.registry import RunRecord
from testbed.net.remote.inventory import Machine
from testbed.net.remote.ssh import Connection


def clean_machine(conn: Connection, m: Machine, root: str, prefix: str) -> str:
    """Remove what run ``prefix`` left on machine ``m`` after its agent died: its registry's record
    there (``testbed clean --run PREFIX`` with the deployed code), then its run folder. Returns a
    note; raises RemoteError if that machine still holds the run."""
    if conn.run(["test", "-d", f"{root}/code/testbed"])[0] != 0:
        conn.run(["rm", "-rf", "--", root])
        return "nothing of the run was left but its folder (removed)"
    code, out, err = conn.run(
        [m.python, "-m", "testbed.cli", "clean", "--run", prefix], env={"PYTHONPATH": f"{root}/code"}, timeout_s=120
    )
    text = out.strip().replace("\n", "; ")
    if code != 0 or "still running" in text:
        raise RemoteError(f"{conn.where}: testbed clean there failed: {(text or err.strip())[-300:]}")
    conn.run(["rm", "-rf", "--", root])
    return text or "cleaned"


def clean_remote_run(rec: RunRecord) -> list[str]:
    """Finish a dead remote run on its machines (``testbed clean``): fetch the traces left in each
    machine's run folder into ``<run folder>/leftover-<machine>/``, let the machine's own registry
    remove what a killed agent left (``testbed clean --run PREFIX`` there, with the deployed code),
    and delete the run folder there. Returns one note per machine; a note starting with "could not"
    means that machine still needs cleaning."""
    inv = rec.remote.get("inventory", {})
    roots = rec.remote.get("roots", {})
    notes = []
    for raw in inv.get("machines", []):
        m = Machine(
            raw["name"],
            raw["address"],
            raw["user"],
            tuple(raw["dcs"]),
            raw["port"],
            Path(raw["key"]) if raw.get("key") else None,
            raw["python"],
            raw["tunnel_address"],
            raw["workdir"],
        )
        root = roots.get(m.name)
        if not root or not root.startswith(m.workdir + "/") or not root.endswith("/" + rec.prefix):
            notes.append(f"could not clean {m.name}: its recorded run folder {root!r} is not <workdir>/{rec.prefix}")
            continue
        try:
            conn = Connection(m, Path(inv["known_hosts"]), inv.get("accept_unknown_host_keys", False)).open()
        except RemoteError as e:
            notes.append(f"could not clean {m.name}: {e}")
            continue
        try:
            code, out, _ = conn.run(["test", "-d", root])
            if code != 0:
                notes.append(f"{m.name}: nothing left")
                continue
            fetched = _fetch_dir(conn, f"{root}/run", Path(rec.out_dir or ".") / f"leftover-{m.name}")
            note = f"{m.name}: {fetched} trace files fetched into {Path(rec.out_dir or '.') / f'leftover-{m.name}'}"
            # the agent removes the deployed code only after its teardown: code left means it was killed
            notes.append(note + "; " + clean_machine(conn, m, root, rec.prefix))
        except RemoteError as e:
            notes.append(f"could not clean {m.name}: {e}")
        finally:
            conn.close()
    return notes


def _fetch_dir(conn: Connection, remote: str, local: Path) -> int:
    """Copy a remote folder's files (recursively) into ``local``; returns how many."""
    import stat

    sftp = conn.sftp()
    n = 0
    try:
        todo = [(remote, local)]
        while todo:
            src, dst = todo.pop()
            try:
                entries = sftp.listdir_attr(src)
            except OSError:
                continue
            dst.mkdir(parents=True, exist_ok=True)
            for e in entries:
                if stat.S_ISDIR(e.st_mode):
                    todo.append((f"{src}/{e.filename}", dst / e.filename))
                else:
                    sftp.get(f"{src}/{e.filename}", str(dst / e.filename))
                    n += 1
    finally:
        sftp.close()
    return n


def finish_machines(conns: list[tuple[Machine, Connection]], gone: set[str], prefix: str) -> list[str]:
    """At the end of run ``prefix``: each machine's run folder removed, and a machine whose agent
    is gone (``gone``) first cleaned from its own registry (``clean_machine``); every connection is
    closed. Returns ``"<machine> (<why>)"`` for each machine that could not be cleaned."""
    unclean = []
    for m, conn in conns:
        root = f"{m.workdir}/{prefix}"
        try:
            if m.name in gone:
                print(f"testbed: machine {m.name}: {clean_machine(conn, m, root, prefix)}", flush=True)
            else:
                conn.run(["rm", "-rf", "--", root], timeout_s=60)
        except RemoteError as e:
            unclean.append(f"{m.name} ({e})")
        conn.close()
    return unclean
