"""Reading a topology file's WAN links, given as a list (``links``) or as a symmetric matrix of rates
and delays (``matrix``); every error names the field or the matrix cell, the value and the fix."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from testbed.errors import SpecError
from testbed.spec.link_profile import LinkProfile
from testbed.spec.link_profile_file import read_profile
from testbed.spec.specfile import FieldReader, split_unit_error
from testbed.spec.topology import LinkSpec
from testbed.spec.topology_fields import LINK_FIELDS, MATRIX_FIELDS
from testbed.spec.units import UnitError, parse_duration_us, parse_rate_bps


def read_link(
    source: str, raw: Any, i: int, dc_names: list[str], fields: dict[str, str] | None = None, folder: Path | None = None
) -> LinkSpec:
    """Link ``i`` of a file's ``links``; ``folder``: where a profile's relative path starts (the
    topology file's folder; default: the current one)."""
    r = FieldReader(source, raw, f"links[{i}]", LINK_FIELDS, fields)
    between = raw["between"]
    if not (isinstance(between, list) and len(between) == 2 and all(isinstance(x, str) for x in between)):
        raise r.fail("between", "is not a pair of DC names", "write it as [dc1, dc2]")
    for name in between:
        if name not in dc_names:
            close = difflib.get_close_matches(name, dc_names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise r.fail("between", f"names unknown DC {name!r}", f"{hint}known DCs are {', '.join(dc_names)}")
    if between[0] == between[1]:
        raise r.fail("between", "joins a DC to itself", "name two different DCs")
    rate, delay, jitter, loss, queue = (r.value(k) for k in ("rate", "delay", "jitter", "loss", "queue"))
    failover, failover_after = r.value("failover"), r.value("failover_after")
    if jitter > delay:
        raise r.fail(
            "jitter",
            f"is larger than the delay ({delay} us), which would need negative delays",
            "use a jitter no larger than the delay",
        )
    link = LinkSpec(
        a=between[0],
        b=between[1],
        rate_bps=rate,
        delay_us=delay,
        jitter_us=jitter,
        loss_pct=loss,
        queue_packets=queue,
        failover=failover,
        failover_after_us=failover_after,
    )
    if raw.get("profile") is None:
        return link
    profile = raw["profile"]
    if isinstance(profile, dict) and "steps" in profile:  # a record's resolved profile (``to_file_dict``)
        try:
            resolved = LinkProfile.from_dict(profile)
        except (KeyError, TypeError, ValueError) as e:
            raise r.fail("profile", f"is not a resolved profile ({e})", "give a file or a generator") from None
    else:
        resolved = read_profile(source, profile, r.at("profile"), link.state, folder or Path("."))
    return LinkSpec(**{**vars(link), "profile": resolved})


def read_matrix(source: str, raw: Any, dc_names: list[str]) -> list[LinkSpec]:
    """Turn a symmetric rate/delay matrix into links; errors name the matrix cell."""
    r = FieldReader(source, raw, "matrix", MATRIX_FIELDS)
    order = raw["dcs"]
    if not isinstance(order, list) or sorted(map(str, order)) != sorted(dc_names):
        raise r.fail("dcs", "does not list exactly the DCs of 'dcs'", f"list {', '.join(dc_names)} in any order")
    n = len(order)
    parsers = {"rate": parse_rate_bps, "delay": parse_duration_us}
    values: dict[str, list[list[Any]]] = {}
    for key, parse in parsers.items():
        m = raw[key]
        if not (isinstance(m, list) and len(m) == n and all(isinstance(row, list) and len(row) == n for row in m)):
            raise r.fail(key, f"is not a {n}x{n} matrix", f"write {n} rows of {n} entries (null for no link)")
        values[key] = [[None] * n for _ in range(n)]
        for i in range(n):
            for j in range(n):
                cell = m[i][j]
                if cell is None:
                    continue
                if i == j:
                    raise SpecError(
                        source, f"matrix.{key}[{i}][{i}]", cell, "links a DC to itself", "write null on the diagonal"
                    )
                try:
                    values[key][i][j] = parse(cell)
                except UnitError as e:
                    raise SpecError(source, f"matrix.{key}[{i}][{j}]", cell, *split_unit_error(e)) from None
    links: list[LinkSpec] = []
    for i in range(n):
        for j in range(i + 1, n):
            for key in parsers:
                if values[key][i][j] != values[key][j][i]:
                    raise SpecError(
                        source,
                        f"matrix.{key}[{i}][{j}]",
                        raw[key][i][j],
                        f"differs from matrix.{key}[{j}][{i}] = {raw[key][j][i]!r}",
                        "links are symmetric: make the matrix symmetric",
                    )
            rate, delay = raw["rate"][i][j], raw["delay"][i][j]
            if (rate is None) != (delay is None):
                raise SpecError(
                    source,
                    f"matrix.rate[{i}][{j}]",
                    rate,
                    f"goes with delay {delay!r}: a link needs both",
                    "give both a rate and a delay, or null for both (no link)",
                )
            if rate is not None:
                fields = {"rate": f"matrix.rate[{i}][{j}]", "delay": f"matrix.delay[{i}][{j}]", "between": "matrix.dcs"}
                links.append(
                    read_link(
                        source,
                        {"between": [order[i], order[j]], "rate": rate, "delay": delay},
                        len(links),
                        dc_names,
                        fields,
                    )
                )
    return links
