"""run_in_process_group against real process trees (a shell or Python child with grandchildren)."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from autotune.backends.process import ProcessOutcome, kill_process_group, run_in_process_group

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process groups are checked through /proc")

BASH = "/bin/bash"
SLACK_S = 3.0  # scheduling slack on a loaded CI machine


def is_step(line: str) -> bool:
    return line.startswith("step:")


def live_members(pgid: int) -> list[int]:
    """Non-zombie processes in the group, from /proc."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(name))
    return members


def assert_gone(pid: int) -> None:
    """The process is gone or a zombie waiting for its parent: it holds nothing any more."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return
    assert state[state.rfind(b")") + 2 : state.rfind(b")") + 3] in (b"Z", b"X"), f"pid {pid} still running"


def assert_group_dead(pgid: int) -> None:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return
    assert live_members(pgid) == [], f"group {pgid} still has live members"


def pids_in_log(log: Path, label: str) -> list[int]:
    return [int(n) for n in re.findall(rf"^{label} (\d+)$", log.read_text(), flags=re.M)]


def run(tmp_path: Path, script: str, **kwargs) -> ProcessOutcome:
    kwargs.setdefault("deadline_s", 30.0)
    kwargs.setdefault("idle_timeout_s", 30.0)
    kwargs.setdefault("kill_grace_s", 1.0)
    return run_in_process_group(
        [BASH, "-c", script], env=dict(os.environ), cwd=tmp_path, log_path=tmp_path / "probe" / "log.txt", **kwargs
    )


TREE = 'echo "leader $$"; sleep 1000 & echo "grandchild $!"; sleep 1000 & echo "grandchild $!"; '


def test_idle_watchdog_kills_the_whole_tree(tmp_path):
    script = TREE + 'echo "step:1"; echo "loading..."; sleep 1000'
    outcome = run(tmp_path, script, idle_timeout_s=1.0, on_output=is_step)
    assert outcome.hung and not outcome.timed_out and not outcome.interrupted
    assert outcome.returncode == -signal.SIGTERM
    assert 1.0 <= outcome.wall_s <= 1.0 + SLACK_S
    (leader,) = pids_in_log(outcome.log_path, "leader")
    grandchildren = pids_in_log(outcome.log_path, "grandchild")
    assert len(grandchildren) == 2
    assert_group_dead(leader)
    for pid in grandchildren:
        assert_gone(pid)
    assert outcome.log_path.read_text().splitlines()[-2:] == ["step:1", "loading..."]


def test_progress_resets_the_idle_clock_and_deadline_still_fires(tmp_path):
    script = TREE + 'i=0; while true; do i=$((i+1)); echo "step:$i"; sleep 0.1; done'
    outcome = run(tmp_path, script, deadline_s=1.5, idle_timeout_s=0.5, on_output=is_step)
    assert outcome.timed_out and not outcome.hung
    assert 1.5 <= outcome.wall_s <= 1.5 + SLACK_S
    (leader,) = pids_in_log(outcome.log_path, "leader")
    assert_group_dead(leader)
    steps = [line for line in outcome.log_path.read_text().splitlines() if line.startswith("step:")]
    assert len(steps) >= 8  # printing every 0.1 s kept the 0.5 s idle watchdog quiet


def test_python_child_with_grandchildren(tmp_path):
    # The shape of verl's driver: a Python process that starts long-lived helpers (Ray, vLLM).
    code = (
        "import subprocess, sys, os, time\n"
        "print('leader', os.getpid(), flush=True)\n"
        "kids = [subprocess.Popen(['sleep', '1000']) for _ in range(3)]\n"
        "for k in kids: print('grandchild', k.pid, flush=True)\n"
        "print('step:1', flush=True)\n"
        "time.sleep(1000)\n"
    )
    outcome = run_in_process_group(
        [sys.executable, "-c", code],
        env=dict(os.environ),
        cwd=tmp_path,
        log_path=tmp_path / "py.log",
        deadline_s=30.0,
        idle_timeout_s=1.0,
        kill_grace_s=1.0,
        on_output=is_step,
    )
    assert outcome.hung
    (leader,) = pids_in_log(outcome.log_path, "leader")
    assert len(pids_in_log(outcome.log_path, "grandchild")) == 3
    assert_group_dead(leader)


def test_should_stop_kills_the_group(tmp_path):
    seen: list[str] = []

    def on_output(line: str) -> bool:
        seen.append(line)
        return is_step(line)

    outcome = run(
        tmp_path,
        TREE + 'for i in 1 2 3 4 5; do echo "step:$i"; sleep 0.05; done; sleep 1000',
        on_output=on_output,
        should_stop=lambda: "step:3" in seen,
    )
    assert not (outcome.hung or outcome.timed_out or outcome.interrupted)
    assert outcome.returncode == -signal.SIGTERM
    assert outcome.wall_s <= SLACK_S
    (leader,) = pids_in_log(outcome.log_path, "leader")
    assert_group_dead(leader)


def test_normal_exit_returns_its_code_and_reaps_leftovers(tmp_path):
    outcome = run(tmp_path, 'sleep 1000 & echo "grandchild $!"; echo "step:1"; exit 7')
    assert outcome.returncode == 7
    assert not (outcome.hung or outcome.timed_out or outcome.interrupted)
    (orphan,) = pids_in_log(outcome.log_path, "grandchild")
    assert_gone(orphan)
    assert outcome.wall_s <= SLACK_S


def test_log_and_callback_get_every_line(tmp_path):
    seen: list[str] = []
    script = "seq 1 20000; printf 'tail without newline'"
    outcome = run(tmp_path, script, on_output=lambda line: seen.append(line) or True)
    assert outcome.returncode == 0
    expected = [str(i) for i in range(1, 20001)] + ["tail without newline"]
    assert seen == expected
    assert outcome.log_path.read_text() == "\n".join(expected) + "\n"


def test_stderr_is_merged_and_bad_bytes_are_replaced(tmp_path):
    outcome = run(tmp_path, "echo out; echo err >&2; printf 'bad \\xff byte\\n'")
    assert outcome.returncode == 0
    assert outcome.log_path.read_text().splitlines() == ["out", "err", "bad \ufffd byte"]


def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    # `trap '' TERM` is inherited by the background sleep, so only SIGKILL ends the group.
    outcome = run(tmp_path, "trap '' TERM; " + TREE + 'echo "step:1"; sleep 1000', idle_timeout_s=0.5, kill_grace_s=0.5)
    assert outcome.hung
    assert outcome.returncode == -signal.SIGKILL
    assert 1.0 <= outcome.wall_s <= 1.0 + SLACK_S
    (leader,) = pids_in_log(outcome.log_path, "leader")
    assert_group_dead(leader)


def test_keyboard_interrupt_in_on_output_kills_the_group_and_reraises(tmp_path):
    lines: list[str] = []

    def on_output(line: str) -> bool:
        lines.append(line)
        if line == "step:2":
            raise KeyboardInterrupt
        return is_step(line)

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, TREE + 'for i in 1 2 3; do echo "step:$i"; done; sleep 1000', on_output=on_output)
    assert time.monotonic() - started <= SLACK_S
    leader = int(lines[0].split()[1])
    assert_group_dead(leader)
    for line in lines:
        if line.startswith("grandchild "):
            assert_gone(int(line.split()[1]))


def test_exception_in_should_stop_kills_the_group(tmp_path):
    def should_stop() -> bool:
        raise RuntimeError("pruner failed")

    with pytest.raises(RuntimeError, match="pruner failed"):
        run(tmp_path, TREE + "sleep 1000", should_stop=should_stop)
    text = (tmp_path / "probe" / "log.txt").read_text()
    for pid in pids_in_log(tmp_path / "probe" / "log.txt", "grandchild"):
        assert_gone(pid)
    if "leader" in text:
        assert_group_dead(pids_in_log(tmp_path / "probe" / "log.txt", "leader")[0])


def test_signal_from_outside_is_interrupted(tmp_path):
    outcome = run(tmp_path, 'echo "step:1"; kill -TERM $$; sleep 1000')
    assert outcome.interrupted and outcome.returncode == -signal.SIGTERM


def test_kill_process_group_on_a_gone_group(tmp_path):
    outcome = run(tmp_path, 'echo "leader $$"')
    (leader,) = pids_in_log(outcome.log_path, "leader")
    assert kill_process_group(leader, grace_s=0.1) is True


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"deadline_s": 0}, "deadline_s"),
        ({"idle_timeout_s": -1}, "idle_timeout_s"),
        ({"kill_grace_s": -0.5}, "kill_grace_s"),
    ],
)
def test_bad_limits_are_rejected(tmp_path, kwargs, field):
    with pytest.raises(ValueError, match=field):
        run(tmp_path, "true", **kwargs)


def test_empty_argv_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="argv"):
        run_in_process_group(
            [], env={}, cwd=tmp_path, log_path=tmp_path / "l", deadline_s=1, idle_timeout_s=1
        )


# ---- probe identity (issue 20 items 4, 5) -------------------------------------------------------------------

def _sleeper_group(env_extra: dict | None = None):
    import subprocess

    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                            env={**os.environ, **(env_extra or {})})


def test_a_recorded_group_id_now_used_by_another_job_is_not_killed(tmp_path):
    """PID reuse: the file names a live group, but none of its processes carries the probe's token."""
    import json

    from autotune.backends.process import end_recorded_probe, group_alive

    other = _sleeper_group()  # an unrelated job that got the number
    try:
        record = tmp_path / "probe.pgid"
        record.write_text(json.dumps({"token": "f" * 32, "pgid": other.pid}))
        assert end_recorded_probe(record, grace_s=1.0) is False
        assert group_alive(other.pid), "an unrelated job survived"
        assert not record.exists()
        record.write_text(str(other.pid))  # an old-style file: a bare number is never trusted
        assert end_recorded_probe(record, grace_s=1.0) is False and group_alive(other.pid)
    finally:
        other.kill()
        other.wait()


def test_a_probe_whose_group_id_was_never_written_is_found_by_its_token(tmp_path):
    """kill -9 between fork and the pgid write: the token, written before the fork, finds the probe."""
    import json

    from autotune.backends.process import TOKEN_ENV, end_recorded_probe, group_alive

    probe = _sleeper_group({TOKEN_ENV: "a" * 32})
    try:
        record = tmp_path / "probe.pgid"
        record.write_text(json.dumps({"token": "a" * 32}))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not Path(f"/proc/{probe.pid}/environ").exists():
            time.sleep(0.01)
        time.sleep(0.2)  # exec done: /proc shows the child's own environment
        assert end_recorded_probe(record, grace_s=1.0) is True
        probe.wait(timeout=10)
        assert not group_alive(probe.pid)
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()


def test_the_token_is_recorded_before_the_probe_starts_and_the_probe_carries_it(tmp_path):
    import json

    from autotune.backends.process import TOKEN_ENV

    record = tmp_path / "probe.pgid"
    seen = []
    code = f"import os; print(os.environ['{TOKEN_ENV}'], flush=True)"

    def on_output(line: str) -> bool:
        seen.append((line, json.loads(record.read_text())))
        return True

    run_in_process_group([sys.executable, "-c", code], env=dict(os.environ), cwd=tmp_path,
                         log_path=tmp_path / "log", deadline_s=30, idle_timeout_s=30, on_output=on_output,
                         pgid_file=record)
    (line, rec), = seen
    assert rec["token"] == line and isinstance(rec["pgid"], int)
    assert not record.exists(), "removed once the group is gone"
