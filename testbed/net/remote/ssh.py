"""SSH to the machines of ``--backend remote`` (paramiko), and the quoting of remote commands.

Host keys are checked against the inventory's known_hosts file and an unknown or changed key is
refused, unless the inventory says ``accept_unknown_host_keys: true`` (then a key never seen is
trusted for this run only; a *changed* key is still refused). Commands are argument lists: every
word is quoted for the remote POSIX shell (``shlex.quote``), so an inventory value or a path is
never interpreted by a shell. Nothing secret (keys, passphrases) is logged or written to traces.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from testbed.errors import RemoteError
from testbed.net.remote.inventory import Machine

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# paramiko logs its own tracebacks (e.g. "Error reading SSH protocol banner") through logging's
# last-resort handler; every failure is reported once, as a RemoteError
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


def remote_command(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """The command line a remote login shell runs for ``argv``: ``cd -- CWD && exec env -- K=V ... ARGV``,
    every word quoted (``shlex.quote``). Raises ValueError for an empty argv or a bad variable name."""
    if not argv:
        raise ValueError("empty command")
    words = [shlex.quote(str(a)) for a in argv]
    if env:
        for key in env:
            if not _ENV_NAME.match(key):
                raise ValueError(f"bad environment variable name {key!r}")
        words = ["env", "--", *(shlex.quote(f"{k}={v}") for k, v in env.items()), *words]
    line = "exec " + " ".join(words)
    if cwd:
        line = f"cd -- {shlex.quote(cwd)} && {line}"
    return line


def load_known_hosts(client, path: Path) -> None:
    """Load ``path`` into ``client``'s host keys. OpenSSH's ``@cert-authority`` lines (host
    certificates, which paramiko cannot check) are skipped; an ``@revoked`` line (which paramiko
    would ignore, accepting the revoked key) or a line paramiko cannot parse is refused, naming the
    line. Raises RemoteError."""
    import tempfile

    from paramiko.hostkeys import HostKeyEntry

    if not path.is_file():
        raise RemoteError(f"known_hosts {path} is not a file: name the known_hosts file in the inventory")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise RemoteError(f"known_hosts {path} cannot be read ({e}): name an OpenSSH known_hosts file") from None
    kept = []
    for n, line in enumerate(text.splitlines(), 1):
        word = line.strip()
        if not word or word.startswith("#") or word.startswith("@cert-authority"):
            continue
        if word.startswith("@revoked"):
            raise RemoteError(
                f"known_hosts {path} line {n} marks a revoked key, which paramiko would not honour: "
                "give the inventory a known_hosts file without @revoked lines"
            )
        try:
            entry = HostKeyEntry.from_line(word, n)
        except Exception as e:  # InvalidHostKey, binascii.Error, ...
            raise RemoteError(
                f"known_hosts {path} line {n} is not a host key line ({type(e).__name__}): fix or "
                "remove it (ssh-keygen -R HOST removes a host's lines)"
            ) from None
        if entry is None:
            raise RemoteError(f"known_hosts {path} line {n} is not a host key line: fix or remove it")
        kept.append(word)
    with tempfile.NamedTemporaryFile("w", suffix=".known_hosts") as f:
        f.write("\n".join(kept) + "\n")
        f.flush()
        # HostKeys.load, not client.load_host_keys: that would make AutoAddPolicy write keys back
        client.get_host_keys().load(f.name)


class Connection:
    """One SSH connection to a machine (paramiko ``SSHClient``). Raises RemoteError, naming the
    machine and the fix, for an unreachable machine, an unknown or changed host key, or a refused
    login."""

    def __init__(
        self, machine: Machine, known_hosts: Path, accept_unknown: bool = False, timeout_s: float = 10.0
    ) -> None:
        self.machine, self.known_hosts, self.accept_unknown, self.timeout_s = (
            machine,
            known_hosts,
            accept_unknown,
            timeout_s,
        )
        self.client = None

    @property
    def where(self) -> str:
        m = self.machine
        return f"machine {m.name} ({m.user}@{m.address}:{m.port})"

    def open(self) -> Connection:
        import paramiko

        m = self.machine
        client = paramiko.SSHClient()
        if self.known_hosts.exists():
            load_known_hosts(client, self.known_hosts)
        elif not self.accept_unknown:
            raise RemoteError(
                f"known_hosts file {self.known_hosts} does not exist, so no host key of {self.where} "
                "can be verified: ssh to it once and check its key fingerprint, or name the right "
                "file in the inventory's known_hosts"
            )
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy() if self.accept_unknown else paramiko.RejectPolicy())
        try:
            client.connect(
                m.address,
                port=m.port,
                username=m.user,
                key_filename=str(m.key) if m.key else None,
                timeout=self.timeout_s,
                banner_timeout=self.timeout_s,
                auth_timeout=self.timeout_s,
                look_for_keys=m.key is None,
                allow_agent=m.key is None,
            )
        except paramiko.PasswordRequiredException:
            client.close()
            raise RemoteError(
                f"{self.where}: the key {m.key} is encrypted with a passphrase, which the testbed "
                "never asks for: load it into ssh-agent and leave the machine's key: out of the "
                "inventory (then the agent's keys are used)"
            ) from None
        except paramiko.BadHostKeyException as e:
            client.close()
            raise RemoteError(
                f"{self.where} offered a host key ({e.key.get_name()} {e.key.get_fingerprint().hex()}) "
                f"that differs from the one in {self.known_hosts}: someone may be intercepting the "
                "connection. If the machine was reinstalled, remove the old key (ssh-keygen -R) and "
                "verify the new one"
            ) from None
        except paramiko.AuthenticationException:
            client.close()
            raise RemoteError(
                f"{self.where} refused the login: check the inventory's user and key, and that the "
                "key's public half is in that user's authorized_keys there"
            ) from None
        except paramiko.SSHException as e:
            client.close()
            text = str(e)
            if "known_hosts" in text:
                raise RemoteError(
                    f"{self.where} is not in {self.known_hosts}: ssh to it once and check its key "
                    "fingerprint, or (only on a network you trust) set accept_unknown_host_keys: true "
                    "in the inventory"
                ) from None
            if "private key" in text or "key file" in text:
                raise RemoteError(
                    f"{self.where}: the inventory's key {m.key} cannot be used ({text}): give the "
                    "private key file (not the .pub), in OpenSSH or PEM format"
                ) from None
            if "banner" in text:
                raise RemoteError(
                    f"{self.where}: no SSH server answered on port {m.port} ({text}): check the "
                    "machine's address and port"
                ) from None
            raise RemoteError(f"{self.where}: SSH failed ({text})") from None
        except ValueError as e:  # paramiko's key parsers raise it for a malformed key file
            client.close()
            raise RemoteError(
                f"{self.where}: the inventory's key {m.key} cannot be read ({e}): give an unencrypted private key file"
            ) from None
        except (TimeoutError, OSError) as e:
            client.close()
            raise RemoteError(
                f"{self.where} is unreachable ({e.strerror or e}): check its address and port, and that sshd runs there"
            ) from None
        transport = client.get_transport()
        transport.set_keepalive(5)
        self.client = client
        return self

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float = 120.0,
    ) -> tuple[int, str, str]:
        """Run ``argv`` there to completion: (exit status, stdout, stderr). Raises RemoteError on a
        timeout or a lost connection."""
        chan = self.start(argv, env, cwd)
        chan.settimeout(timeout_s)
        try:
            out = chan.makefile("rb").read().decode(errors="replace")
            err = chan.makefile_stderr("rb").read().decode(errors="replace")
            code = chan.recv_exit_status()
        except TimeoutError:
            raise RemoteError(f"{self.where}: {argv[0]} did not finish within {timeout_s:g} s") from None
        finally:
            chan.close()
        return code, out, err

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None):
        """Start ``argv`` there and return its paramiko ``Channel`` (stdin/stdout/stderr)."""
        if self.client is None:
            raise RemoteError(f"{self.where}: not connected")
        try:
            chan = self.client.get_transport().open_session(timeout=self.timeout_s)
            chan.exec_command(remote_command(argv, env, cwd))
        except Exception as e:  # paramiko raises several unrelated types for a dropped connection
            raise RemoteError(f"{self.where}: cannot start {argv[0]} ({type(e).__name__}: {e})") from None
        return chan

    def addresses(self) -> tuple[str, str]:
        """(this machine's address as the machine sees it, the machine's address): the two ends
        of the SSH connection, the management network's addresses of both."""
        sock = self.client.get_transport().sock
        return sock.getsockname()[0], sock.getpeername()[0]

    def sftp(self):
        return self.client.open_sftp()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
