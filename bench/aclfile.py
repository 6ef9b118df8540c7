"""Write an ACL file of N rules for benchmarking a node with an ACL.

    python -m bench.aclfile /tmp/acl-1000.toml --rules 1000
    weir up --acl-file /tmp/acl-1000.toml        # in one shell
    weir bench fan-in                            # in another; then again without --acl-file

The rules are a mix of the kinds a real file has (per user, per client id,
per network, placeholders, QoS and retain conditions, `eq` topics), none of
which matches the benchmark's clients or topics (`bench/...`), so every
check walks all N-1 of them before the last rule, "allow the rest", decides.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from services.auth.aclfile import read

DEFAULT_RULES = 1000


def rule(i: int) -> str:
    """Rule number i (0-based) of the file: deny something the benchmark never does."""
    kind = i % 6
    if kind == 0:
        return f'permission = "deny"\nuser = "user-{i}"\ntopics = ["data/{i}/#"]'
    if kind == 1:
        return f'permission = "deny"\nclient = "dev-{i}"\naction = "publish"\ntopics = ["d/+/{i}"]'
    if kind == 2:
        return f'permission = "deny"\nip = "10.{i % 250}.{i // 250}.0/24"\ntopics = ["net/{i}/#"]'
    if kind == 3:
        return f'permission = "deny"\naction = "publish"\ntopics = ["tenants/%u/{i}/#"]'
    if kind == 4:
        return (
            f'permission = "deny"\naction = "publish"\ntopics = ["q/{i}"]\nqos = [2]\nretain = true'
        )
    return f'permission = "deny"\naction = "subscribe"\ntopics = [{{eq = "all/{i}/#"}}]'


def text(rules: int) -> str:
    body = [f"# {rules} rules for `weir bench` (bench/aclfile.py)"]
    body += [f"[[rule]]\n{rule(i)}\n" for i in range(rules - 1)]
    body.append('[[rule]]\npermission = "allow"\n')
    return "\n".join(body)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.aclfile", description="Write an ACL file of N rules."
    )
    parser.add_argument("out", type=Path, help="the file to write")
    parser.add_argument("--rules", type=int, default=DEFAULT_RULES, help="how many (1000)")
    args = parser.parse_args(list(argv))  # bad arguments: usage and exit 2
    if args.rules < 1:
        parser.error("--rules must be at least 1")
    args.out.write_text(text(args.rules), encoding="utf-8")
    print(f"{args.out}: {len(read(args.out))} rules")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
