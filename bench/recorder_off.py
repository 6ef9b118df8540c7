"""A build of the node with the metrics recorder off, for the overhead benchmark.

    python -m bench.recorder_off [--out DIR] [--keep] -- [weir up options...]

The figures are plain integers the message path adds to (`services/metrics/
registry.py`): there is no recorder object to swap for a no-op one, and a
switch read per increment would cost more than the increment. So the
baseline is built: this copies `services/` into DIR (default: a temporary
directory) with every statement that counts into the figures removed (an
augmented assignment to `...metrics.<field>` or `...metrics.<field>[...]`,
or to those of a local named `metrics`, and the calls
`metrics.connected()` / `metrics.disconnected()`) and with the parts that
read them on timers not started (`MetricsService.start`: HTTP, $SYS,
alarms, the loop-lag probe; `ClusterFigures.start`: the cluster fold),
then runs `python -m services up` from that copy (PYTHONPATH=DIR and
PYTHONSAFEPATH=1, so neither the current directory's `services/` nor the
editable install comes first, and `--nodes`/`--workers` children inherit
both) with the options given, plus
`--http-port off --sys-interval 0`. It prints how many statements it took
out; a build that took out none is an error (the code moved: fix the
pattern, or the baseline is not one).

Compare, same machine, same run, e.g. QoS 0 fan-in and QoS 1 pairs:

    weir up --backend memory &                      # metrics on
    weir bench fan-in --qos 0; weir bench pairs --qos 1
    python -m bench.recorder_off -- --backend memory &  # metrics off
    weir bench fan-in --qos 0; weir bench pairs --qos 1
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

SERVICES = Path(__file__).resolve().parents[1] / "services"
NOT_STARTED = {"MetricsService": "start", "ClusterFigures": "start"}  # class -> method


def _counts_into_metrics(target: ast.expr) -> bool:
    """`x.metrics.f`, `x.metrics.f[k]`, `metrics.f`, `metrics.f[k]`: a figure;
    `tally[k]`, `x.tally[k]`: the per-message counts (registry.Metrics.tally)."""
    if isinstance(target, ast.Subscript):
        target = target.value
        if isinstance(target, ast.Name) and target.id == "tally":
            return True
        if isinstance(target, ast.Attribute) and target.attr == "tally":
            return True
    if not isinstance(target, ast.Attribute):
        return False
    owner = target.value
    if isinstance(owner, ast.Name):
        return owner.id == "metrics"
    return isinstance(owner, ast.Attribute) and owner.attr == "metrics"


def _is_metrics_call(node: ast.stmt) -> bool:
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    func = node.value.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr in ("connected", "disconnected")
        and _counts_into_metrics(func)
    )


class _Strip(ast.NodeTransformer):
    def __init__(self) -> None:
        self.removed = 0
        self._class: str | None = None

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        outer, self._class = self._class, node.name
        self.generic_visit(node)
        self._class = outer
        return node

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        return self._function(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return self._function(node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        if self._class is not None and NOT_STARTED.get(self._class) == node.name:
            node.body = [ast.Pass()]
            self.removed += 1
            return node
        self.generic_visit(node)
        return node

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST:
        if _counts_into_metrics(node.target):
            self.removed += 1
            return ast.copy_location(ast.Pass(), node)
        return node

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        if _is_metrics_call(node):
            self.removed += 1
            return ast.copy_location(ast.Pass(), node)
        return node


def strip(source: str) -> tuple[str, int]:
    """`source` without its counting statements; and how many it lost."""
    tree = ast.parse(source)
    stripper = _Strip()
    tree = stripper.visit(tree)
    if not stripper.removed:
        return source, 0
    return ast.unparse(ast.fix_missing_locations(tree)), stripper.removed


def build(out: Path) -> int:
    """Copy services/ into `out` with the recorder off; statements removed."""
    target = out / "services"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(SERVICES, target, ignore=shutil.ignore_patterns("__pycache__"))
    removed = 0
    for path in target.rglob("*.py"):
        if path.parent.name == "metrics" and path.name in ("registry.py", "trace.py"):
            continue  # the figures' own declarations and helpers stay as they are
        text, count = strip(path.read_text(encoding="utf-8"))
        if count:
            path.write_text(text, encoding="utf-8")
            removed += count
    return removed


def _run(command: list[str], env: dict[str, str]) -> int:
    """Run the node; SIGINT, SIGTERM and SIGUSR1 sent to us go to it (it stops
    in order, and never outlives us)."""
    child = subprocess.Popen(command, env=env)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(sig, forward)
    return child.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recorder_off",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--out", type=Path, help="build here (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary build")
    parser.add_argument("up", nargs=argparse.REMAINDER, help="-- then weir up's options")
    args = parser.parse_args(argv)
    up = [a for a in args.up if a != "--"] if args.up[:1] == ["--"] else list(args.up)
    out = args.out or Path(tempfile.mkdtemp(prefix="weir-recorder-off-"))
    try:
        removed = build(out)
        if removed == 0:
            print("bench.recorder_off: no counting statement found to remove", file=sys.stderr)
            return 1
        print(f"bench.recorder_off: {removed} counting statements removed, build in {out}",
              file=sys.stderr, flush=True)  # fmt: skip
        env = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONPATH": os.pathsep.join(
            [str(out), *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
        command = [sys.executable, "-m", "services", "up", *up,
                   "--http-port", "off", "--sys-interval", "0"]  # fmt: skip
        return _run(command, env)
    finally:
        if args.out is None and not args.keep:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
