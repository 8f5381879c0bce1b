"""The fibres as measured beside the bench file's, every difference named, and a patch that
makes the file say what the walk found.

A patch moves each NIC's ``tx_port`` and ``rx_port`` to where its fibres were found, the meter
taps' ``port`` to the port each was seen on, and the baseline's cross-connects with the NICs
they join (a baseline is meant as host to host; its port numbers follow the fibres). Switch
monitors are the switch's own ports and stay. The file's text is edited in place: its comments
and layout are kept.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import yaml

from lumion_hil.harness.commissioning.walk import FibreMap


@dataclass(frozen=True)
class Difference:
    """One thing the bench file says that the walk found otherwise."""

    path: tuple  # where in the file: ("topology", "hosts", 1, "nics", 0, "tx_port")
    text: str  # in the lab's words
    value: Any  # what it should say; None: nothing to patch (said, not fixable by a number)


def compare(bench, found: FibreMap) -> list[Difference]:
    """Every difference between the bench file and what the walk found, NICs first."""
    out: list[Difference] = []
    new_tx: dict[int, int] = {}  # the file's port -> the port the same fibre was found on
    new_rx: dict[int, int] = {}
    for hi, host in enumerate(bench.topology.hosts):
        for ni, nic in enumerate(host.nics):
            key = f"{host.name}.{nic.name}"
            where = ("topology", "hosts", hi, "nics", ni)
            tx, rx = found.transmitters.get(key), found.receivers.get(key)
            if tx is not None and tx.port != nic.tx_port:
                out.append(Difference(where + ("tx_port",), f"{key} transmits into port {tx.port}; the bench file "
                                                            f"says {nic.tx_port}", tx.port))
                new_tx[nic.tx_port] = tx.port
            if rx is not None and rx.port != nic.rx_port:
                out.append(Difference(where + ("rx_port",), f"{key} receives from port {rx.port}; the bench file "
                                                            f"says {nic.rx_port}", rx.port))
                new_rx[nic.rx_port] = rx.port
            for why in found.not_found.get(key, []):
                out.append(Difference(where, f"{key}: {why}", None))
    for di, det in enumerate(bench.detectors):
        if det.instrument == bench.topology.switch:
            continue
        seen = next((t for t in found.taps if (t.instrument, t.channel) == (det.instrument, det.channel)), None)
        if seen is not None and seen.port != det.port:
            out.append(Difference(("detectors", di, "port"), f"detector {det.name} ({det.instrument} channel "
                                  f"{det.channel}) sees port {seen.port}; the bench file says {det.port}", seen.port))
    for bi, (ingress, egress) in enumerate(bench.safety.baseline):
        moved = [new_tx.get(ingress, ingress), new_rx.get(egress, egress)]
        if moved != [ingress, egress]:
            tx_owner, rx_owner = bench.nic_on_tx_port(ingress), bench.nic_on_rx_port(egress)
            joins = (f"{tx_owner[0].name}.{tx_owner[1].name}" if tx_owner else f"port {ingress}") + " -> " + \
                    (f"{rx_owner[0].name}.{rx_owner[1].name}" if rx_owner else f"port {egress}")
            out.append(Difference(("safety", "baseline", bi), f"baseline [{ingress}, {egress}] ({joins}) is "
                                  f"{moved} with the fibres where they are", moved))
    return out


def patched_text(text: str, differences: list[Difference]) -> str:
    """The bench file's text with each difference's value written in its place (comments,
    order and layout kept). Values are numbers or lists of numbers."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    edits = []
    for diff in differences:
        if diff.value is None:
            continue
        if root is None:
            raise ValueError(f"the bench file is empty: nowhere to write {'.'.join(map(str, diff.path))}")
        node = _node(root, diff.path)
        if isinstance(diff.value, list):  # a flow sequence such as [1, 20]: each item in place
            for item, value in zip(node.value, diff.value):
                edits.append((item.start_mark.index, item.end_mark.index, str(value)))
        else:
            edits.append((node.start_mark.index, node.end_mark.index, str(diff.value)))
    for start, end, value in sorted(edits, reverse=True):
        text = text[:start] + value + text[end:]
    return text


def unified_diff(text: str, patched: str, name: str) -> str:
    return "".join(difflib.unified_diff(text.splitlines(keepends=True), patched.splitlines(keepends=True),
                                        f"a/{name}", f"b/{name}"))


def _node(root: yaml.Node, path: tuple) -> yaml.Node:
    node = root
    for key in path:
        if isinstance(node, yaml.MappingNode):
            node = next(v for k, v in node.value if k.value == key)
        else:
            node = node.value[key]
    return node
