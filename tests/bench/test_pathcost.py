"""bench.pathcost: the in-process message path's cost, per variant."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import uvloop

from bench import pathcost


@pytest.mark.parametrize("scenario", pathcost.SCENARIOS)
def test_a_run_moves_every_message_and_reports_its_cost(scenario: str) -> None:
    # A copy missing or a PUBACK not sent would raise (the step checks the bytes out).
    assert pathcost.child(scenario, 1_000, 0) > 0


def test_the_plugins_variant_runs_its_callbacks() -> None:
    async def hooked() -> tuple[int, int]:
        node = pathcost._Node(3)
        step = await pathcost.fan_in(node)
        delivered = node.broker.seams.hooks.callbacks("message.delivered")
        calls = []
        for callback in delivered:
            node.broker.seams.hooks.remove("message.delivered", callback)

        def counted(client_id: str, message: object) -> None:
            calls.append(client_id)

        node.broker.seams.hooks.add("message.delivered", counted)
        sent = await step()
        return len(delivered), len(calls) - sent

    assert uvloop.run(hooked()) == (3, 0)


def test_the_recorder_off_variant_imports_the_build_first(tmp_path: Path) -> None:
    env = pathcost._env("recorder_off", tmp_path, {})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), str(pathcost.ROOT)]
    assert env["PYTHONSAFEPATH"] == "1"
    assert pathcost._env("base", tmp_path, {})["PYTHONPATH"] == str(pathcost.ROOT)


def test_the_summary_is_each_variant_before_over_after() -> None:
    costs = {"base": [10.0, 12.0, 11.0], "recorder_off": [9.5, 9.0, 9.8], "plugins": [11.0, 12.5]}
    line = pathcost.summary("fan-in", costs)
    assert line["us_per_msg"]["base"] == {"best": 10.0, "median": 11.0, "mean": 11.0}
    assert line["metrics_on_vs_off"] == {
        "best": 0.9, "median": round(9.5 / 11.0, 3),
        "paired": round(sorted([9.5 / 10, 9.0 / 12, 9.8 / 11])[1], 3),  # run by run
    }  # fmt: skip
    assert line["plugins_vs_none"]["best"] == round(10 / 11, 3)
    assert line["plugins_vs_none"]["median"] == round(11 / 11.75, 3)
    assert line["plugins_vs_none"]["paired"] == round((10 / 11 + 12 / 12.5) / 2, 3)


def test_an_interleaved_run_gives_every_variant_its_slices(tmp_path: Path) -> None:
    from bench import recorder_off

    assert recorder_off.build(tmp_path) > 0
    costs = pathcost._interleaved("fan-in", 4, 500, 2, tmp_path, {})
    assert {v: len(c) for v, c in costs.items()} == dict.fromkeys(pathcost.VARIANTS, 4)
    assert all(cost > 0 for c in costs.values() for cost in c)


def test_the_env_variant_runs_base_under_its_variables(tmp_path: Path) -> None:
    """`--env PYTHONMALLOC=malloc`: a fourth child, this tree under the C
    library's allocator; the other children keep the environment as it is."""
    extra = {"PYTHONMALLOC": "malloc"}
    env = pathcost._env("env", tmp_path, extra)
    assert env["PYTHONMALLOC"] == "malloc" and env["PYTHONPATH"] == str(pathcost.ROOT)
    assert pathcost._env("base", tmp_path, extra).get("PYTHONMALLOC") == os.environ.get(
        "PYTHONMALLOC"
    )
    costs = pathcost._interleaved("fan-in", 2, 300, 0, tmp_path, extra)
    assert sorted(costs) == sorted((*pathcost.VARIANTS, "env"))
    line = pathcost.summary("fan-in", costs)
    assert set(line["env_vs_base"]) == {"best", "median", "paired"}


def test_a_variable_that_is_not_name_equals_value_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        pathcost.main(["--env", "PYTHONMALLOC"])
    assert "'PYTHONMALLOC' is not NAME=VALUE" in capsys.readouterr().err
