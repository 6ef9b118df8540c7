"""Short, bounded runs of the generator against a real Mosquitto, through the CLI."""

from __future__ import annotations

import pytest

from tests.support.bench_cli import bench

COMMON_KEYS = {
    "scenario",
    "qos",
    "broker",
    "sent",
    "expected",
    "received",
    "loss",
    "duplicates",
    "msg_per_s",
    "duration_s",
    "latency",
    "publishers",
    "subscribers",
}


@pytest.mark.parametrize("scenario", ["fan-in", "pairs"])
def test_qos1_run_receives_every_message_once(scenario: str, mosquitto: tuple[int, int]) -> None:
    port, _ = mosquitto
    [line] = bench(
        scenario, "--qos", "1", "--port", str(port), "--messages", "3000", "--duration", "20"
    )
    assert line.keys() >= COMMON_KEYS
    assert (line["scenario"], line["qos"], line["broker"]) == (scenario, 1, f"127.0.0.1:{port}")
    assert line["sent"] == 3000
    assert line["received"] == line["expected"] == 3000
    assert line["loss"] == 0 and line["duplicates"] == 0 and line["acked"] == 3000
    assert line["acked_lost"] == 0 and line["unacked"] == 0
    assert line["msg_per_s"] > 0 and line["duration_s"] > 0
    assert line["broker_cpu"] >= 0


def test_fan_out_splits_by_default_and_latency_splits_on_request(
    mosquitto: tuple[int, int],
) -> None:
    port = str(mosquitto[0])
    [fan_out] = bench("fan-out", "--qos", "1", "--port", port, "--messages", "50")
    assert fan_out["split"] is True
    assert fan_out["expected"] == fan_out["received"] == 50 * 100
    assert fan_out["acked_lost"] == 0 and fan_out["unacked"] == 0
    [latency] = bench("latency", "--split", "--port", port, "--rate", "1000", "--messages", "200")
    assert latency["split"] is True
    assert latency["received"] == 200
    assert latency["latency"]["samples"] == 200
    assert "acked_lost" not in latency  # QoS 0
    [latency1] = bench(
        "latency", "--qos", "1", "--port", port, "--rate", "1000", "--messages", "200"
    )
    assert latency1["acked"] == 200 and latency1["acked_lost"] == 0
    assert 0 < latency["latency"]["p50_ms"] <= latency["latency"]["p99_ms"]
    [pairs] = bench("pairs", "--port", port, "--messages", "500")
    assert pairs["split"] is False


def test_idle_weighs_connections(mosquitto: tuple[int, int]) -> None:
    port, pid = mosquitto
    [line] = bench("idle", "--port", str(port), "--connections", "300", "--workers", "2")
    assert line["connected"] == 300 and line["failed"] == 0
    assert line["broker_pid"] == pid
    assert line["broker_rss_after_kib"] > 0
    assert line["connect_rate_per_s"] > 0


def test_vs_alternates_and_ends_with_the_ratio(mosquitto: tuple[int, int]) -> None:
    port, _ = mosquitto
    lines = bench(
        "pairs",
        "--qos",
        "1",
        "--port",
        str(port),
        "--messages",
        "1000",
        "--vs",
        f"127.0.0.1:{port}",
        "--rounds",
        "2",
        "--duration",
        "20",
    )
    assert [line.get("scenario") for line in lines[:4]] == ["pairs"] * 4
    assert all(line["received"] == 1000 for line in lines[:4])
    assert all(line["acked_lost"] == 0 for line in lines[:4])
    assert lines[4]["rounds"] == 2
    assert lines[4]["throughput_ratio_median"] > 0


def test_spawn_mosquitto_is_the_peer(mosquitto: tuple[int, int]) -> None:
    port, _ = mosquitto
    lines = bench(
        "fan-in",
        "--qos",
        "1",
        "--port",
        str(port),
        "--messages",
        "800",
        "--spawn-mosquitto",
        "--rounds",
        "1",
        "--duration",
        "20",
    )
    ours, peer, summary = lines
    assert ours["broker"] == f"127.0.0.1:{port}"
    assert peer["broker"] != ours["broker"] and peer["broker"].startswith("127.0.0.1:")
    assert ours["received"] == peer["received"] == 800
    assert (summary["ours"], summary["peer"]) == (ours["broker"], peer["broker"])


def test_rounds_take_turns_at_going_first(mosquitto: tuple[int, int]) -> None:
    """A,B then B,A: neither broker always runs right after the other's round."""
    port, _ = mosquitto
    lines = bench("fan-in", "--qos", "0", "--port", str(port), "--messages", "400",
                  "--spawn-mosquitto", "--rounds", "2", "--duration", "20")  # fmt: skip
    *runs, summary = lines
    ours = f"127.0.0.1:{port}"
    assert [run["broker"] == ours for run in runs] == [True, False, False, True]
    assert summary["rounds"] == 2 and summary["ours"] == ours


def test_suback_times_each_new_subscription(mosquitto: tuple[int, int]) -> None:
    [line] = bench("suback", "--port", str(mosquitto[0]), "--messages", "50", "--duration", "20")
    assert (line["scenario"], line["sent"], line["received"]) == ("suback", 50, 50)
    assert line["latency"]["samples"] == 50
    assert 0 < line["latency"]["p50_ms"] <= line["latency"]["p99_ms"]
    assert line["msg_per_s"] > 0
