"""The rules job: the messages table, docs/rules.md's example end to end on the
embedded Kafka, and bad rules refused in one line before anything runs."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from services.config.rules import OutputMode, Rule, Sink
from streams import rules
from streams.config import JobConfig
from streams.messages import messages

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
T0 = 1_700_000_040_000  # ms, the start of a minute


def example() -> dict[str, Any]:
    """The config file of docs/rules.md's example, as written there."""
    text = DOCS.read_text(encoding="utf-8")
    block = re.search(r"```toml\n(.*?)```", text, re.S)
    assert block is not None, "docs/rules.md has no TOML example"
    return tomllib.loads(block.group(1))


def example_rule(prefix: str) -> Rule:
    """The example's rule on this test's own topics."""
    (table,) = example()["rule"]
    table = {**table, "topics": [prefix + "telemetry"], "sink_topic": prefix + "alerts"}
    return Rule(**table)


def envelope(clientid: str, topic: str, payload: bytes, ts_ms: int,
             props: list[list[str]] | None = None) -> bytes:  # fmt: skip
    """A message as the bridge's default value (services.bridge.templates.envelope)."""
    from services.bridge.templates import Fields
    from services.bridge.templates import envelope as render
    from services.mqtt.packets import Message, Properties

    properties = Properties(user_property=tuple((name, value) for name, value in props or []))
    message = Message(topic=topic, payload=payload, qos=1, retain=False, sender=clientid,
                      properties=properties)  # fmt: skip
    return render(Fields(message, username=None, timestamp_ms=ts_ms))


# -- the messages table ----------------------------------------------------------


def test_messages_parse_the_envelope_its_payload_and_first_user_property(
    spark: SparkSession,
) -> None:
    from streams.events import raw_schema

    records = [
        envelope("dev-1", "tele/dev-1/temp", b'{"temp": 31.5}', T0, [["a", "1"], ["a", "2"]]),
        envelope("dev-2", "tele/dev-2/temp", b"\xff\x00", T0 + 1),  # not UTF-8: base64
        b"not an envelope",
    ]
    raw = spark.createDataFrame(
        [("k", 0, i, "dev", value, None) for i, value in enumerate(records)], raw_schema()
    )
    got = {r["offset"]: r for r in messages(raw, "temp DOUBLE").collect()}
    first = got[0]
    assert (first["clientid"], first["topic"], first["qos"], first["json"]["temp"]) == (
        "dev-1", "tele/dev-1/temp", 1, 31.5,
    )  # fmt: skip
    assert first["user_properties"] == {"a": "1"}
    assert int(first["ts"].timestamp() * 1000) == T0
    b64 = got[1]
    assert (b64["payload_encoding"], b64["payload"], b64["json"]) == ("base64", "/wA=", None)
    assert (got[2]["clientid"], got[2]["ts"], got[2]["kafka_topic"]) == (None, None, "k")


# -- the example end to end ------------------------------------------------------


def produce(bootstrap: str, topic: str, records: list[tuple[str, bytes]]) -> None:
    from confluent_kafka import Producer, admin

    client = admin.AdminClient({"bootstrap.servers": bootstrap})
    client.create_topics([admin.NewTopic(topic, 2, 1)])[topic].result(10)
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(10) == 0


def consume_all(bootstrap: str, topic: str) -> list[Any]:
    """Every record of `topic`, read to the end of each partition."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-rules",
                         "enable.partition.eof": True, "enable.auto.commit": False})  # fmt: skip
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        left, found = set(parts), []
        while left:
            for m in consumer.consume(100, timeout=1.0):
                err = m.error()
                if err is None:
                    found.append(m)
                elif err.code() == KafkaError._PARTITION_EOF:
                    left.discard(m.partition())
        return found
    finally:
        consumer.close()


def config(bootstrap: str, tmp_path: Path, *given: Rule) -> JobConfig:
    return JobConfig(bootstrap=bootstrap, redis_url=None, data_dir=str(tmp_path),
                     available_now=True, rules=given)  # fmt: skip


@pytest.mark.kafka
def test_the_example_rule_alerts_in_kafka_and_a_failing_rule_does_not_stop_it(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic_prefix: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    hot = example_rule(kafka_topic_prefix)
    source = hot.topics[0]
    readings = [("dev-1", 31.0, 0), ("dev-1", 33.0, 1_000), ("dev-2", 20.0, 0), ("dev-2", 22, 500)]
    produce(kafka_bootstrap, source, [
        (dev, envelope(dev, f"tele/{dev}/temp", json.dumps({"temp": t}).encode(), T0 + at))
        for dev, t, at in readings
    ])  # fmt: skip
    # A rule that fails at run time (assert_true on every row), beside the example.
    broken = Rule(name="broken", sql="SELECT assert_true(qos > 5) AS never FROM messages",
                  topics=(source,), sink=Sink.CONSOLE)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="weir.streams.rules"):
        assert rules.run(config(kafka_bootstrap, tmp_path, hot, broken)) == 1

    alerts = consume_all(kafka_bootstrap, str(hot.sink_topic))
    assert [m.key() for m in alerts] == [b"dev-1"]  # dev-2's average stays under 30
    alert = json.loads(alerts[0].value())
    assert (alert["clientid"], alert["avg_temp"], alert["readings"]) == ("dev-1", 32.0, 2)
    assert alert["minute"].startswith("2023-11-14T22:14:00")  # T0's minute, in UTC
    headers = dict(alerts[0].headers())
    assert headers["weir-rule"] == b"hot"
    assert re.fullmatch(rb"[0-9a-f-]{36}:\d+", headers["weir-batch"])
    failed = [r.getMessage() for r in caplog.records if "rule broken: failed" in r.getMessage()]
    assert len(failed) == 1 and "\n" not in failed[0], failed
    assert (tmp_path / "checkpoints" / "rules" / "hot" / "weir-rule.json").exists()

    # Run again over the same checkpoint: nothing new, no second alert; a changed
    # rule is refused with its checkpoint's directory.
    assert rules.run(config(kafka_bootstrap, tmp_path, hot)) == 0
    assert len(consume_all(kafka_bootstrap, str(hot.sink_topic))) == 1
    changed = dataclasses.replace(hot, sql=hot.sql.replace("> 30", "> 40"))
    with pytest.raises(rules.RuleError, match=r"rule 'hot': its sql changed since its checkpoint"):
        rules.run(config(kafka_bootstrap, tmp_path, changed))


# -- bad rules: one line, exit 2, nothing started -----------------------------------


BAD = [
    ("SELEC clientid FROM messages", {}, r"rule 'bad': sql: \[PARSE_SYNTAX_ERROR\]"),
    ("SELECT nope FROM messages", {}, r"rule 'bad': sql: \[UNRESOLVED_COLUMN"),
    ("SELECT * FROM elsewhere", {}, r"rule 'bad': sql: \[TABLE_OR_VIEW_NOT_FOUND\]"),
    ("SELECT 1 AS one", {}, r"rule 'bad': sql: reads no streaming table \(FROM messages\)"),
    ("SELECT clientid FROM messages", {"payload_schema": "temp NOPE"},
     r"rule 'bad': payload_schema: "),
    ("SELECT clientid FROM messages", {"sink": Sink.KAFKA, "sink_topic": "x", "key": "dev"},
     r"rule 'bad': key: no column 'dev' in the result \(columns: clientid\)"),
    ("SELECT clientid, count(*) AS n FROM messages GROUP BY clientid",
     {"output_mode": OutputMode.APPEND}, r"rule 'bad': output_mode: \[STREAMING_OUTPUT_MODE"),
]  # fmt: skip


@pytest.mark.kafka
@pytest.mark.parametrize(("sql", "more", "message"), BAD, ids=[m.split(": ")[1] + str(i)
                                                              for i, (_, _, m) in enumerate(BAD)])
def test_a_bad_rule_is_one_line_before_any_rule_runs(
    spark: SparkSession, kafka_bootstrap: str, tmp_path: Path, sql: str, more: dict[str, Any],
    message: str,
) -> None:  # fmt: skip
    good = Rule(name="good", sql="SELECT * FROM messages", topics=("t",), sink=Sink.CONSOLE)
    bad = Rule(**{"name": "bad", "sql": sql, "topics": ("t",), "sink": Sink.CONSOLE, **more})
    with pytest.raises(rules.RuleError) as raised:
        rules.run(config(kafka_bootstrap, tmp_path, good, bad))
    line = raised.value.format_message()
    assert re.match(message, line), line
    assert "\n" not in line
    assert not spark.streams.active and not (tmp_path / "checkpoints").exists()


@pytest.mark.kafka
def test_the_command_says_a_bad_rule_in_one_line_and_exits_2(
    spark: SparkSession, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from streams.cli import main

    path = tmp_path / "weir.toml"
    path.write_text('[[rule]]\nname = "r"\nsql = "SELECT nope FROM messages"\n'
                    'topics = ["t"]\nsink = "console"\n')  # fmt: skip
    capsys.readouterr()
    code = main(["rules", "--config", str(path), "--kafka", kafka_bootstrap,
                 "--data-dir", str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("weir streams run: rule 'r': sql: "), err


@pytest.mark.kafka
def test_a_rule_failing_while_running_is_restarted_from_its_checkpoint(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic_prefix: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Not with available_now: the job goes on, the rule is started again after a
    back-off (that the other rules go on is the example's test above)."""
    import threading
    import time

    source = kafka_topic_prefix + "telemetry"
    produce(kafka_bootstrap, source, [
        ("dev-1", envelope("dev-1", "tele/dev-1/temp", b'{"temp": 31}', T0))
    ])  # fmt: skip
    broken = Rule(name="broken", sql="SELECT assert_true(qos > 5) AS never FROM messages",
                  topics=(source,), sink=Sink.CONSOLE)  # fmt: skip
    job = dataclasses.replace(config(kafka_bootstrap, tmp_path, broken),
                              available_now=False, trigger_s=0.2)  # fmt: skip
    (planned,) = [rules.plan(spark, rule, job) for rule in job.rules]
    stop = threading.Event()

    def watch() -> None:
        """Stop once the rule failed and was started again."""
        deadline = time.monotonic() + 240  # a loaded 2-core machine: Spark's first batches
        while time.monotonic() < deadline and not (planned.failures and planned.query):
            stop.wait(0.2)  # polling the supervisor's record, not standing in for a sync
        stop.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with caplog.at_level(logging.INFO, logger="weir.streams.rules"):
        rules.supervise([planned], job, stop)
    watcher.join(5)
    assert planned.failures >= 1 and planned.ended is None  # restarted, not given up
    messages_ = [r.getMessage() for r in caplog.records]
    failed = [m for m in messages_ if m.startswith("rule broken: failed (")]
    assert failed and "restarting from its checkpoint in 1 s" in failed[0], messages_
    assert sum(m.startswith("rule broken: started") for m in messages_) >= 2, messages_
    assert not spark.streams.active
