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

import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import click

from services.cli import CONTEXT, Command, run
from services.config import load
from services.config.flags import given, settings_flags, some
from services.machine.pidfiles import NodeFiles, StalePidFile, live_pid, nodes_dir
from services.machine.pidfiles import node_ids as pid_node_ids

DRAIN_SIGNAL = signal.SIGUSR1


@click.command(
    "drain", cls=Command, context_settings=CONTEXT,
    help="Tell nodes of weir up --nodes/--workers to drain (SIGUSR1): clients are sent "
    "elsewhere (MQTT 5: DISCONNECT 0x9C), then the node exits and is not restarted. "
    "NODE-ID...: the nodes (default: all).",
)  # fmt: skip
@click.argument("node_ids", nargs=-1, metavar="[NODE-ID]...")
@click.option("--config", help="TOML config file (default: $WEIR_CONFIG)")
@settings_flags(some("data_dir"))
def drain(node_ids: tuple[str, ...], config: str | None, **flags: Any) -> int:
    settings = load({"config": config, **given(flags)})
    root = nodes_dir(settings.data_dir)
    wanted = list(node_ids) or pid_node_ids(settings.data_dir)
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


def main(argv: Sequence[str]) -> int:
    return run(drain, argv, "weir drain")
