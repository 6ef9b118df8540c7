"""The wiring contract of services/ (STYLE 18): parts are wired in constructors.

- Nothing hands a callable or a collaborator to another object after that
  object was built: no `other.attr = <lambda>`, no `other.attr = self...`
  (one of the assigner's own methods or parts, or itself), and no property
  setter (`Broker.cluster` was one). Values and records may still be written
  (`conn.session = session`): this looks only at what wires.
- Each `Session` field is written only in the module of the part that owns
  it (`Session.OWNERS`); anyone may build a Session with its first values.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from services.broker.ports import Session

ROOT = Path(__file__).resolve().parents[1]
SERVICES = sorted((ROOT / "services").rglob("*.py"))

# The exceptions, and why: both are a cluster link's state, not the node's
# wiring. An outbound link's asyncio protocol is made by the event loop's
# factory, before its link is known; the link names itself to it once the
# handshake is answered. An inbound link names itself as the one whose frame
# is being handled while it hands the frame on (`Links.receiving`).
LATE_ALLOWED = {
    ("services/cluster/links.py", "proto.peer"),
    ("services/cluster/links.py", "links.receiving"),
}

# A setter that forwards a number, not a collaborator: the append bound the EventLog
# protocol lets its callers set (the memory log has it as a plain field), kept by the
# Kafka log's producer part (services/event/appender.py).
SETTERS_ALLOWED = {("services/event/kafka.py", "append_timeout_s")}

MUTATORS = {"append", "extend", "pop", "update", "clear", "setdefault", "remove", "add", "discard"}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _assignments(tree: ast.AST) -> Iterator[tuple[ast.expr, ast.expr | None, int]]:
    """(target, the value assigned to it if known, line) for every assignment."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    yield from (
                        (t, v, node.lineno)
                        for t, v in zip(target.elts, node.value.elts, strict=False)
                    )
                elif isinstance(target, ast.Tuple):
                    yield from ((t, None, node.lineno) for t in target.elts)
                else:
                    yield target, node.value, node.lineno
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            yield node.target, node.value, node.lineno


def _root(expr: ast.expr) -> ast.expr:
    while isinstance(expr, ast.Attribute | ast.Subscript | ast.Call):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr


def _is_self(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Name) and expr.id == "self"


def _wires(value: ast.expr | None) -> bool:
    """A lambda, `self`, or something of `self`'s that is not called: a
    callback or a collaborator, not a value."""
    if isinstance(value, ast.Lambda):
        return True
    if _is_self(value) if value is not None else False:
        return True
    return isinstance(value, ast.Attribute) and _is_self(_root(value))


def late_wiring(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for target, value, line in _assignments(tree):
        if not isinstance(target, ast.Attribute) or _is_self(target.value):
            continue
        if _wires(value) and (_rel(path), ast.unparse(target)) not in LATE_ALLOWED:
            found.append(f"{_rel(path)}:{line}: {ast.unparse(target)} = {ast.unparse(value)}")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                allowed = (_rel(path), node.name) in SETTERS_ALLOWED
                if isinstance(deco, ast.Attribute) and deco.attr == "setter" and not allowed:
                    found.append(f"{_rel(path)}:{node.lineno}: setter {node.name}")
    return found


def test_nothing_is_wired_after_construction() -> None:
    assert [line for path in SERVICES for line in late_wiring(path)] == []


def _field_writes(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(field, line) for every write to `x.<field>` where x is not an
    attribute of `self` (a part's own state: `self.tiers.durable`):
    assignment, augmented assignment, item assignment or deletion, or a
    mutating call."""
    for assigned, _, line in _assignments(tree):
        target = assigned
        while isinstance(target, ast.Subscript):
            target = target.value
        if isinstance(target, ast.Attribute) and not _is_self(_root(target)):
            yield target.attr, line
    for node in ast.walk(tree):
        if isinstance(node, ast.Delete):
            for target in node.targets:
                deleted = target.value if isinstance(target, ast.Subscript) else None
                if isinstance(deleted, ast.Attribute) and not _is_self(_root(deleted)):
                    yield deleted.attr, node.lineno
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and isinstance(node.func.value, ast.Attribute)
            and not _is_self(_root(node.func.value))
        ):
            yield node.func.value.attr, node.lineno


def test_session_fields_are_written_by_their_owners_only() -> None:
    owners = Session.OWNERS
    assert set(owners) == set(Session.__slots__) - {"client_id"}  # every field has one
    misplaced = []
    for path in sorted((ROOT / "services" / "broker").glob("*.py")):
        module = path.stem
        for field, line in _field_writes(ast.parse(path.read_text(encoding="utf-8"))):
            if field in owners and owners[field] != module:
                misplaced.append(f"{_rel(path)}:{line}: {field} (owner: {owners[field]})")
    assert misplaced == []


def test_the_checks_see_what_they_forbid() -> None:
    """The rules above catch the shapes they are about (each can fail)."""
    late = ast.parse(
        "a.on_x = self.f\nb.cb = lambda: 0\nc.owner = self\nd.value = 1\nself.ok = self.f\n"
    )
    wired = [ast.unparse(t) for t, v, _ in _assignments(late)
             if isinstance(t, ast.Attribute) and not _is_self(t.value) and _wires(v)]  # fmt: skip
    assert wired == ["a.on_x", "b.cb", "c.owner"]
    writes = ast.parse("s.subs[f] = o\ns.acks.append(1)\ndel s.subs[f]\ns.epoch += 1\n")
    assert sorted(f for f, _ in _field_writes(writes)) == ["acks", "epoch", "subs", "subs"]
