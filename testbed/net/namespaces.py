"""The rtnetlink handles of a run's namespaces on this machine: one ``IPRoute`` per namespace,
opened inside it, usable from any thread (pyroute2 0.9 opens one socket per thread, lazily, in the
thread's current namespace: a new thread's socket is opened inside the right one here)."""

from __future__ import annotations

import threading

from pyroute2 import IPRoute

from testbed.net import netlink


class NamespaceHandles:
    """``{namespace name: IPRoute}`` for the namespaces a run created or attached."""

    def __init__(self) -> None:
        self._ipr: dict[str, IPRoute] = {}
        self._builder_tid = threading.get_ident()
        self._bound: set[tuple[int, str]] = set()
        self._ifindex: dict[tuple[str, str], int] = {}

    def add(self, netns: str, ipr: IPRoute) -> None:
        self._ipr[netns] = ipr

    def __contains__(self, netns: str) -> bool:
        return netns in self._ipr

    def any(self) -> IPRoute:
        """One of the handles (a namespace of our own, e.g. to probe a kernel feature)."""
        return next(iter(self._ipr.values()))

    def ipr(self, netns: str) -> IPRoute:
        """The handle of ``netns``, usable from the calling thread."""
        ipr, tid = self._ipr[netns], threading.get_ident()
        if tid != self._builder_tid and (tid, netns) not in self._bound:
            netlink.bind_thread(ipr, netns)
            self._bound.add((tid, netns))
        return ipr

    def ifindex(self, netns: str, ifname: str) -> int:
        """The index of ``ifname`` in ``netns`` (looked up once)."""
        key = (netns, ifname)
        if key not in self._ifindex:
            self._ifindex[key] = netlink.ifindex(self.ipr(netns), ifname)
        return self._ifindex[key]

    def close(self) -> None:
        for ipr in self._ipr.values():
            ipr.close()
        self._ipr.clear()
        self._ifindex.clear()
