"""The ``--hosts`` list of horovodrun (``node1:4,node2:4``), parsed once and strictly.

With Gloo, horovodrun starts every slot the ``-H`` list offers, whatever ``-np`` says, and it
rejects a host without ``:SLOTS`` only when the train stage starts (after hours of preprocessing).
So the pipeline checks the list up front and hands horovodrun exactly ``np`` slots.
"""

from __future__ import annotations

import re

from dlrm_contracts.errors import ExitCode, PipelineError

_ITEM = re.compile(r"^([A-Za-z0-9_.-]+)(?::([0-9]+))?$")


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """[(host, slots)] in order; a host without ``:SLOTS`` has one slot."""
    parsed: list[tuple[str, int]] = []
    for item in (h.strip() for h in hosts.split(",") if h.strip()):
        match = _ITEM.match(item)
        if match is None:
            raise PipelineError(f"--hosts item {item!r} must look like HOST or HOST:SLOTS", ExitCode.USAGE)
        host, slots = match[1], int(match[2] or 1)
        if slots < 1:
            raise PipelineError(f"--hosts item {item!r} offers no slot", ExitCode.USAGE)
        if any(host == seen for seen, _ in parsed):
            raise PipelineError(f"--hosts names {host} twice (give its slots once: {host}:N)", ExitCode.USAGE)
        parsed.append((host, slots))
    if not parsed:
        raise PipelineError("--hosts names no host", ExitCode.USAGE)
    return parsed


def host_slots(hosts: str) -> int:
    """Total slots of a host list."""
    return sum(slots for _, slots in parse_hosts(hosts))


def horovodrun_hosts(hosts: str, np: int) -> str:
    """The ``-H`` value giving exactly ``np`` slots, filling the hosts in the order given."""
    out, left = [], np
    for host, slots in parse_hosts(hosts):
        if left == 0:
            break
        take = min(slots, left)
        out.append(f"{host}:{take}")
        left -= take
    if left:
        raise PipelineError(
            f"--np {np} is more than the {host_slots(hosts)} slots of --hosts {hosts}", ExitCode.USAGE
        )
    return ",".join(out)
