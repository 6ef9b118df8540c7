"""`weir drain [--data-dir D] [NODE-ID ...]`: tell nodes of `weir up --nodes N`
/ `--workers N` to drain.

Draining is SIGUSR1 to the node (`services.node.app`): it stops accepting,
MQTT 5 clients get DISCONNECT 0x9C "use another server" (with its
--server-reference as the Server Reference), 3.1.1 clients are closed, and
the node exits 0 once they are gone or its shutdown grace has passed; the
supervisor does not restart a node that exits 0. This command finds the
nodes through the supervisor's pid files (`services.machine.pidfiles`): the
named ones, or every one with a pid file. It reports each node it signalled
on stdout, and each it could not (no pid file, a stale one) in one line on
stderr; exit 0 when every node was signalled, 1 otherwise, 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from services.machine.pidfiles import NodeFiles, StalePidFile, live_pid, node_ids, nodes_dir
from services.settings import SettingsError, load

DRAIN_SIGNAL = signal.SIGUSR1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SettingsError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="weir drain",
        description="Tell nodes of weir up --nodes/--workers to drain (SIGUSR1): clients "
        "are sent elsewhere (MQTT 5: DISCONNECT 0x9C), then the node exits and is not restarted.",
    )
    p.add_argument("node_ids", nargs="*", metavar="NODE-ID", help="the nodes (default: all)")
    p.add_argument("--data-dir", dest="data_dir", help="weir up's --data-dir (./weir-data)")
    p.add_argument("--config", help="TOML config file (default: $WEIR_CONFIG)")
    return p


def main(argv: Sequence[str]) -> int:
    try:
        args = parser().parse_args(list(argv))
        settings = load({"data_dir": args.data_dir, "config": args.config})
    except SettingsError as exc:
        print(f"weir drain: {exc}", file=sys.stderr)
        return 2
    root = nodes_dir(settings.data_dir)
    wanted = args.node_ids or node_ids(settings.data_dir)
    if not wanted:
        print(
            f"weir drain: no node pid files in {root} (is weir up --nodes/--workers running "
            "with this --data-dir?)",
            file=sys.stderr,
        )
        return 1
    failed = 0
    for node_id in wanted:
        try:
            pid = live_pid(NodeFiles(node_id, root))
            os.kill(pid, DRAIN_SIGNAL)
        except (StalePidFile, ProcessLookupError, PermissionError) as exc:
            failed += 1
            print(f"weir drain: node {node_id}: {exc}", file=sys.stderr)
            continue
        print(f"weir drain: node {node_id} (pid {pid}) told to drain", flush=True)
    return 1 if failed else 0
