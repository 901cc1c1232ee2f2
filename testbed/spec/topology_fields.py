"""The fields of a topology file (``fields.FieldTable``): its top level, a DC, a WAN link, the
matrix form of the links and the address pools. Read by ``topology_file.py`` and
``topology_links.py`` and listed on the reference page; defaults are ``topology.py``'s
(``DCSpec``, ``LinkSpec``, ``TopologySpec``; a unit test keeps them equal)."""

from __future__ import annotations

from testbed.spec.fields import REQUIRED, Field, FieldTable
from testbed.spec.topology import DEFAULT_QUEUE_PACKETS, IFNAME_MAX, MAX_DELAY_US, WAN_IFNAME_PREFIX, TopologySpec

#: a one-way delay's fix (the ceiling, 10 s, is ``topology.MAX_DELAY_US``)
DELAY_FIX = "write a delay between 0ms and 10s"

DC_FIELDS = FieldTable(
    "topology: dcs[i]",
    "dcs[i]",
    "One datacenter: its hosts (one host, one emulated GPU) behind one switch.",
    (
        Field(
            "name",
            "text",
            "the DC's name",
            default=REQUIRED,
            rule=f"lowercase letters, digits and `-`, starting with a letter, at most "
            f"{IFNAME_MAX - len(WAN_IFNAME_PREFIX)} characters (the WAN interface's name is "
            f"`{WAN_IFNAME_PREFIX}<name>`)",
        ),
        Field("hosts", "int", "emulated GPUs, one worker process each", "hosts", REQUIRED, low=1),
        Field(
            "intra_rate",
            "rate",
            "each host's access link, both directions",
            "bit/s",
            default_text="unshaped",
            low=0,
            low_open=True,
        ),
        Field(
            "intra_delay",
            "duration",
            "each host's access link, one way",
            "µs",
            0,
            low=0,
            high=MAX_DELAY_US,
            fix=DELAY_FIX,
        ),
        Field(
            "decode_hosts",
            "int",
            "the last this many hosts serve BubbleTea's decode steps and never train",
            "hosts",
            0,
            low=0,
            rule="below `hosts`",
        ),
    ),
)

LINK_FIELDS = FieldTable(
    "topology: links[i]",
    "links[i]",
    "A WAN link between two DCs; every figure applies to each direction.",
    (
        Field("between", "pair", "the two DCs it joins, `[east, west]`", default=REQUIRED),
        Field("rate", "rate", "the link's rate (HTB)", "bit/s", REQUIRED, low=0, low_open=True),
        Field(
            "delay",
            "duration",
            "one-way delay (a path's RTT is twice the sum of its links' delays)",
            "µs",
            REQUIRED,
            low=0,
            high=MAX_DELAY_US,
            fix=DELAY_FIX,
        ),
        Field(
            "jitter",
            "duration",
            "half-width of a uniform spread around the delay",
            "µs",
            0,
            low=0,
            high=MAX_DELAY_US,
            fix=DELAY_FIX,
            rule="at most `delay`",
        ),
        Field(
            "loss",
            "percent",
            "per-packet drop probability",
            "%",
            0.0,
            low=0,
            high=100,
            high_open=True,
            fix="write a loss probability from 0% up to (not including) 100%",
        ),
        Field(
            "queue",
            "int",
            "the bottleneck queue (HTB leaf); one below a path's bandwidth-delay product is warned of",
            "packets",
            DEFAULT_QUEUE_PACKETS,
            low=1,
            fix="write a number of packets, such as 1000",
        ),
        Field(
            "profile",
            "path",
            "how the link's rate, delay, jitter and loss change while it is up: a CSV or Mahimahi file, "
            "a YAML file, or a generator mapping (see the link profile tables)",
            default_text="none: the figures hold",
        ),
        Field(
            "failover",
            "bool",
            "when the link goes down, the routers move its routes to the other path (and back when it returns)",
            default=False,
            rule="only on a link whose DCs stay connected without it",
        ),
        Field(
            "failover_after",
            "duration",
            "how long the routers take to see the link down or up (BFD: three missed 100 ms hellos)",
            "µs",
            300_000,
            low=0,
            high=60_000_000,
            fix="write a detection time between 0ms and 60s, such as 300ms",
        ),
    ),
)

MATRIX_FIELDS = FieldTable(
    "topology: matrix",
    "matrix",
    "The WAN as a symmetric matrix instead of `links`: cell [i][j] joins `dcs[i]` and `dcs[j]`, "
    "`null` for no link (and on the diagonal).",
    (
        Field("dcs", "list", "every DC of `dcs`, in the matrix's order", default=REQUIRED),
        Field("rate", "matrix", "rates, as a link's `rate`", default=REQUIRED),
        Field("delay", "matrix", "one-way delays, as a link's `delay`", default=REQUIRED),
    ),
)

ADDRESSING_FIELDS = FieldTable(
    "topology: addressing",
    "addressing",
    "Where the hosts' and the WAN links' addresses come from (change them only where they clash with "
    "the machine's own networks).",
    (
        Field("dc_pool", "network", "the DCs' subnets are cut from this pool", default=TopologySpec.dc_pool),
        Field("dc_prefix_len", "int", "each DC's subnet", "prefix bits", 24, low=16, high=29),
        Field("wan_pool", "network", "the WAN links' /30s are cut from this pool", default=TopologySpec.wan_pool),
    ),
)

TOPOLOGY_FIELDS = FieldTable(
    "topology",
    "",
    "A topology file (`topologies/*.yaml`): the DCs, their hosts and the WAN links between them.",
    (
        Field("name", "text", "the topology's name", default_text="the file's name"),
        Field("description", "text", "a sentence on what it models", default="", default_text="none"),
        Field("dcs", "list", "the datacenters, at least one", default=REQUIRED, table=DC_FIELDS.name),
        Field("links", "list", "the WAN links", default_text="none (one DC)", table=LINK_FIELDS.name),
        Field("matrix", "section", "the WAN links as a matrix, instead of `links`", table=MATRIX_FIELDS.name),
        Field(
            "addressing",
            "section",
            "the address pools",
            default_text="see its table",
            table=ADDRESSING_FIELDS.name,
        ),
        Field(
            "tcp_congestion",
            "text",
            "the hosts' TCP congestion control (one the kernel has, e.g. `cubic`, `bbr`)",
            default_text="the machine's default",
        ),
    ),
)
