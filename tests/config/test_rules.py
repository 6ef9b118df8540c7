"""`[[rule]]` tables: read into settings; a bad one is one line (exit 2), no Spark needed."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from services.config import SettingsError, load
from services.config.rules import DEFAULT_TABLE, DEFAULT_WATERMARK, OutputMode, Sink

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
TABLE = '[[rule]]\nname = "r"\nsql = "SELECT * FROM messages"\ntopics = ["t"]\nsink = "console"\n'


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "weir.toml"
    path.write_text(text)
    return str(path)


def test_the_docs_example_is_one_config_file_for_weir_up_and_the_rules_job(
    tmp_path: Path,
) -> None:
    block = re.search(r"```toml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    assert block is not None
    settings = load({"config": write(tmp_path, block.group(1))}, env={})
    (rule,) = settings.rule
    assert [b.topic for b in settings.bridge.kafka_out] == list(rule.topics)
    assert [b.topics for b in settings.bridge.kafka_in] == [(rule.sink_topic,)]
    assert (rule.sink, rule.sink_topic, rule.key) == (Sink.KAFKA, "alerts", "clientid")
    assert (rule.table, rule.watermark, rule.output_mode) == (
        DEFAULT_TABLE, DEFAULT_WATERMARK, OutputMode.UPDATE,
    )  # fmt: skip
    assert tomllib.loads(block.group(1))["rule"][0]["sql"] == rule.sql


BAD = [
    ('sink = "kafka"', "rule 'r': sink_topic: sink = \"kafka\" needs the Kafka topic"),
    ('sink = "email"', "rule 'r': sink: must be one of 'kafka', 'parquet' or 'console'"),
    ('key = "clientid"', "rule 'r': sink_topic and key are for sink = \"kafka\", not 'console'"),
    ("topics = []", "rule 'r': topics: Tuple should have at least 1 item"),
    ('topics = ["a b"]', "rule 'r': topics: topic 'a b': a Kafka topic is 1-249 of"),
    ('name = "a/b"', "rule 'a/b': name: name 'a/b': 1-64 of A-Z a-z 0-9 _ -"),
    ('table = "my table"', "rule 'r': table: 'my table': a SQL name is a letter or _"),
    ('output_mode = "later"', "rule 'r': output_mode: must be one of 'update', 'append'"),
    ('sinks = "console"', "rule 'r': unknown key 'sinks'"),
]


def _table(extra: str) -> str:
    key = extra.partition(" = ")[0]
    lines = [line for line in TABLE.splitlines() if not line.startswith(f"{key} =")]
    return "\n".join([*lines, extra]) + "\n"


@pytest.mark.parametrize(("extra", "error"), BAD)
def test_a_bad_table_is_one_line(tmp_path: Path, extra: str, error: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load({"config": write(tmp_path, _table(extra))}, env={})
    message = str(caught.value)
    assert "\n" not in message
    assert error in message, message


def test_a_missing_sink_two_rules_of_one_name_and_a_nameless_one(tmp_path: Path) -> None:
    no_sink = TABLE.replace('sink = "console"\n', "")
    with pytest.raises(SettingsError, match=r"rule 'r': sink: Field required"):
        load({"config": write(tmp_path, no_sink)}, env={})
    with pytest.raises(SettingsError, match="two rules are named 'r'"):
        load({"config": write(tmp_path, TABLE + TABLE)}, env={})
    with pytest.raises(SettingsError, match=r"rule 1: needs a name"):
        load({"config": write(tmp_path, TABLE.replace('name = "r"\n', ""))}, env={})


def test_the_rules_job_without_rules_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Before Spark starts: the command's own check."""
    done = subprocess.run(
        [sys.executable, "-m", "streams", "run", "rules", "--config", write(tmp_path, ""),
         "--kafka", "127.0.0.1:9", "--data-dir", str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "weir streams run: no [[rule]] tables in the config file (--config FILE or "
        "WEIR_CONFIG; docs/rules.md)"
    )
