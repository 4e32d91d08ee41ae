"""``sparkonce verify --faults broker-kill``: how the user's kill and start commands are taken
(refusals name what is wrong), run (no shell, ``{node}`` replaced, failures named), and how a
trial's node and moment are planned. The kind on a real 3-node cluster: tests/kafka/
test_cluster.py."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from sparkonce.cli import EXIT_USAGE, main
from sparkonce.errors import ConfigError, VerificationError
from sparkonce.verify.injection import BrokerKill
from sparkonce.verify.model import FAULT_KINDS, KNOWN_KINDS, Oracle, plan_fault

PY = sys.executable
APPEND = f"{PY} -c 'import sys; open(sys.argv[1], \"a\").write(sys.argv[2] + chr(10))'"


def test_broker_kill_is_known_and_only_run_when_named() -> None:
    assert "broker-kill" in KNOWN_KINDS and "broker-kill" not in FAULT_KINDS


@pytest.mark.parametrize(
    ("nodes", "kill", "start", "down", "says"),
    [
        (["b1"], "k {node}", "s {node}", 5.0, "at least two broker nodes"),
        (["b1", "b2;rm -rf /"], "k {node}", "s {node}", 5.0, "not ['b2;rm -rf /']"),
        (["b1", "b2"], None, "s {node}", 5.0, "--broker-kill-command None"),
        (["b1", "b2"], "k node", "s {node}", 5.0, "with {node} where the node's name goes"),
        (["b1", "b2"], "k {node}", "", 5.0, "--broker-start-command ''"),
        (["b1", "b2"], "k {node}", "s {node}", -1.0, "--broker-down -1.0"),
    ],
)
def test_what_a_broker_kill_needs_is_refused_by_name(
    nodes: list[str], kill: str | None, start: str | None, down: float, says: str
) -> None:
    with pytest.raises(ConfigError) as err:
        BrokerKill.parse(nodes, kill, start, down)
    assert says in str(err.value)


def test_the_commands_run_without_a_shell_with_the_node_named(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    broker = BrokerKill.parse(
        ["1", "node-2.example:9092"],
        f"{APPEND} {out} kill-{{node}}",
        f"{APPEND} {out} '$HOME {{node}}'",
    )
    assert broker.nodes == ("1", "node-2.example:9092") and broker.down_s == 5.0
    broker.run("kill", "node-2.example:9092", tmp_path / "broker.log")
    broker.run("start", "1", tmp_path / "broker.log")  # quoted words stay whole, unexpanded
    assert out.read_text().splitlines() == ["kill-node-2.example:9092", "$HOME 1"]


def test_a_failing_command_fails_the_trial_naming_it(tmp_path: Path) -> None:
    broker = BrokerKill.parse(
        ["1", "2"],
        f"{PY} -c 'import sys; print(\"no such node\"); sys.exit(3)' {{node}}",
        "s {node}",
    )
    log = tmp_path / "broker.log"
    with pytest.raises(
        VerificationError, match=r"kill command .*sys.exit\(3\)' 2 exited with 3; its output"
    ):
        broker.run("kill", "2", log)
    assert "no such node" in log.read_text()
    missing = BrokerKill.parse(["1", "2"], "k {node}", "/nonexistent/start {node}")
    with pytest.raises(VerificationError, match="start command /nonexistent/start 1 failed"):
        missing.run("start", "1", log)


def test_a_trial_picks_its_node_and_moment_from_its_seed() -> None:
    oracle = Oracle([], 40.0, 4, first_commit_s=20.0, batch_interval_s=3.0)
    nodes = ("1", "2", "3")
    plans = [
        plan_fault("broker-kill", random.Random(f"5:{t}"), oracle, 1, nodes) for t in range(60)
    ]
    assert plans[7] == plan_fault("broker-kill", random.Random("5:7"), oracle, 1, nodes)
    assert {p.node for p in plans} == set(nodes)
    assert all(p.kind == "broker-kill" and p.delay_s is not None for p in plans)
    assert any(p.after_entries for p in plans) and any(not p.after_entries for p in plans)
    assert plans[0].describe().startswith(f"broker-kill of node {plans[0].node} ")
    with pytest.raises(ConfigError, match="needs --broker-nodes"):
        plan_fault("broker-kill", random.Random(1), oracle)


def test_verify_refuses_broker_kill_without_its_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["verify", "p.py", "--faults", "kill,broker-kill"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "at least two broker nodes" in err
    code = main(["verify", "p.py", "--faults", "broker-kill", "--broker-nodes", "a,b"])
    assert code == EXIT_USAGE
    assert "--broker-kill-command None: give the command with {node}" in capsys.readouterr().err
