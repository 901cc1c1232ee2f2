"""One small hierarchy of errors; every message names what is wrong and how to fix it."""

from __future__ import annotations


class TestbedError(Exception):
    """Base of every error the testbed raises on purpose (the CLI prints these without a traceback)."""

    __test__ = False  # not a pytest test class, despite the name


class TestbedWarning(UserWarning):
    """Valid input that will likely not behave as its author expects (a WAN queue below a path's
    bandwidth-delay product, ...). The CLI prints these as ``testbed: warning: ...``."""

    __test__ = False  # not a pytest test class, despite the name


class SpecError(TestbedError):
    """A topology or experiment file is invalid.

    The message names the file, the field (a dotted path such as ``links[1].rate``), the bad
    value and the fix.
    """

    def __init__(self, source: str, field: str, value: object, problem: str, fix: str) -> None:
        self.source, self.field, self.value, self.problem, self.fix = source, field, value, problem, fix
        shown = repr(value)
        if len(shown) > 120:
            shown = shown[:100] + f"... ({len(shown)} characters)"
        super().__init__(f"{source}: {field}: {shown} {problem}; {fix}")


class PrivilegeError(TestbedError):
    """The command needs root (network namespaces, qdiscs, iptables)."""


class FeatureError(TestbedError):
    """A kernel feature or a tool the chosen mechanism needs is missing."""


class BuildError(TestbedError):
    """Realising a topology failed, or the machine cannot carry what the topology asks for."""


class DelayElementError(TestbedError):
    """A userspace delay element (NFQUEUE) died: the emulated delay is no longer applied."""


class CheckError(TestbedError):
    """A measurement of the fidelity check could not be made (a tool failed or timed out)."""


class RemoteError(TestbedError):
    """A machine of ``--backend remote`` is unreachable, refuses the login or its host key, lacks a
    tool or module, or its agent failed."""


class InferenceError(TestbedError, ValueError):
    """A prefill or decode request is invalid (tokens, context length, cache shape or bytes, an
    empty decode batch)."""
