# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Job discovery on constructed /proc trees, and /proc parsing."""

from __future__ import annotations

import pytest
from ansible_collections.pivot.ops.plugins.module_utils.job import (
    JobError,
    JobSpec,
    JobTracker,
    argv_matches,
    parse_env_selectors,
)
from ansible_collections.pivot.ops.plugins.module_utils.procfs import (
    ProcFS,
    catches_signal,
    in_cgroup,
    parse_signal_mask,
    parse_stat,
)


class FakeProcTree:
    """Writes a constructed /proc: stat, cmdline, environ and cgroup per PID."""

    def __init__(self, root) -> None:
        self.root = root
        root.mkdir(exist_ok=True)

    def add(self, pid, ppid, argv, *, sid=None, pgid=None, start=1000, env=None, cgroup="0::/user.slice\n", state="S"):
        directory = self.root / str(pid)
        directory.mkdir(exist_ok=True)
        sid = sid or pid
        pgid = pgid or sid
        stat = f"{pid} ({argv[0][:15]}) {state} {ppid} {pgid} {sid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0\n"
        (directory / "stat").write_text(stat)
        (directory / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in argv) + b"\0")
        env_items = (env or {}).items()
        (directory / "environ").write_bytes(b"".join(f"{key}={value}".encode() + b"\0" for key, value in env_items))
        (directory / "cgroup").write_text(cgroup)

    def remove(self, pid) -> None:
        for child in (self.root / str(pid)).iterdir():
            child.unlink()
        (self.root / str(pid)).rmdir()


@pytest.fixture
def tree(tmp_path):
    procs = FakeProcTree(tmp_path / "proc")
    procs.add(1, 0, ["/sbin/init"])
    procs.add(50, 1, ["sshd: root"], sid=50)
    procs.add(60, 50, ["python3", "AnsiballZ_stop_training.py"], sid=50)
    return procs


def tracker(tree, **spec) -> JobTracker:
    return JobTracker(JobSpec(**spec), ProcFS(str(tree.root)), protected={1, 50, 60})


def test_parse_stat_with_spaces_and_parentheses_in_comm():
    pid, comm, rest = parse_stat("42 (my (weird) name) S 1 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 777 0\n")
    assert (pid, comm, rest[0], rest[1], rest[19]) == (42, "my (weird) name", "S", "1", "777")


def test_signal_masks():
    status = "Name:\tpython3\nSigBlk:\t0000000000000000\nSigIgn:\t0000000001001000\nSigCgt:\t0000000180000202\n"
    caught = parse_signal_mask(status, "SigCgt")
    assert catches_signal({"SigCgt": caught}, 10)  # SIGUSR1 is bit 9
    assert catches_signal({"SigCgt": caught}, 2)
    assert not catches_signal({"SigCgt": caught}, 15)
    assert not catches_signal(None, 10)


def test_cgroup_membership_v2_and_v1_hybrid():
    unit = "/system.slice/trainer.service"
    assert in_cgroup("0::/system.slice/trainer.service\n", unit)
    assert in_cgroup("0::/system.slice/trainer.service/worker-1\n", unit)
    assert in_cgroup("12:cpu:/\n1:name=systemd:/system.slice/trainer.service\n0::/\n", unit)
    assert not in_cgroup("0::/system.slice/trainer.service2\n", unit)
    assert not in_cgroup("4:memory:/system.slice/trainer.service\n", unit), "only the systemd hierarchies count"
    assert not in_cgroup(None, unit)


def test_argv_match_is_exact_or_a_script_by_its_file_name():
    argv = ("python3", "/root/train/train.py", "--lr", "1e-4")
    assert argv_matches(argv, ["/root/train/train.py"])
    assert argv_matches(argv, ["/root/train/train.py", "--lr"])
    assert argv_matches(argv, ["train.py"]), "a bare file name matches the script's path"
    assert not argv_matches(argv, ["/root/other/train.py"]), "a path matches only itself"
    assert not argv_matches(argv, ["/root/train/train.py", "--epochs"])
    assert not argv_matches(argv, ["train"])
    assert not argv_matches(argv, [])


@pytest.mark.parametrize("argv", [
    ("python3", "-u", "/root/mytrain.py"),
    ("python3", "/root/train.py.bak"),
    ("python3", "serve.py", "--config=/root/train.py"),
    ("python3", "-c", "import x; /root/train.py"),
    ("tail", "-f", "/root/train.log"),
])
def test_a_file_name_never_matches_a_substring_or_an_option(argv):
    assert not argv_matches(argv, ["train.py"])


def test_the_users_trainer_is_found_by_its_script_name():
    """CT200 runs ``python3 -u /root/train_dflash_pipeline.py`` under run.sh; the inventory names the script."""
    assert argv_matches(("python3", "-u", "/root/train_dflash_pipeline.py"), ["train_dflash_pipeline.py"])
    assert not argv_matches(("bash", "/root/run.sh"), ["train_dflash_pipeline.py"])


def test_env_selectors():
    assert parse_env_selectors(["TORCHELASTIC_RUN_ID", "JOB=abc"]) == (["TORCHELASTIC_RUN_ID"], {("JOB", "abc")})
    with pytest.raises(JobError, match="no variable name"):
        parse_env_selectors(["=x"])


def test_torchrun_tree_with_sessions_and_env(tree):
    # Constructed torchrun job: run.sh -> agent -> workers (own sessions) -> dataloader; one worker's dataloader
    # was already re-parented to PID 1 but still sits in the worker's session.
    env = {"TORCHELASTIC_RUN_ID": "r1"}
    tree.add(100, 1, ["bash", "/root/run.sh"], sid=100)
    tree.add(101, 100, ["python3", "-m", "torch.distributed.run", "train.py"], sid=100)
    tree.add(110, 101, ["python3", "-u", "train.py"], sid=110, env=env)
    tree.add(111, 1, ["python3", "-u", "train.py"], sid=111, env=env)  # agent lost track of it
    tree.add(112, 1, ["python3", "-c", "dataloader"], sid=110)
    tree.add(200, 1, ["python3", "-u", "train.py"], sid=200, env={"TORCHELASTIC_RUN_ID": "other"})
    job = tracker(tree, cmdline_match=["/root/run.sh"], match_env=["TORCHELASTIC_RUN_ID"])
    members = job.scan(first=True)
    assert sorted(members) == [100, 101, 110, 111, 112]
    assert job.reasons == {100: "selected", 101: "descendant", 110: "descendant", 111: "environment", 112: "session"}


def test_remembered_session_survives_leader_death_but_not_pid_reuse(tree):
    tree.add(300, 1, ["python3", "train.py"], sid=300, start=5000)
    tree.add(301, 300, ["python3", "loader"], sid=300, start=5001)
    job = tracker(tree, cmdline_match=["train.py"])
    assert sorted(job.scan(first=True)) == [300, 301]
    # The leader dies; its child is re-parented but keeps session 300.
    tree.remove(300)
    tree.add(301, 1, ["python3", "loader"], sid=300, start=5001)
    assert sorted(job.scan()) == [301]
    # Later PID 300 is reused by an unrelated session leader: neither it nor its session belongs to the job.
    tree.remove(301)
    tree.add(300, 1, ["vim"], sid=300, start=9000)
    tree.add(302, 300, ["less"], sid=300, start=9001)
    assert job.scan() == {}


def test_pidfile_not_trusted_after_the_first_scan(tree, tmp_path):
    pidfile = tmp_path / "job.pid"
    pidfile.write_text("400\n")
    tree.add(400, 1, ["python3", "train.py"], start=7000)
    job = tracker(tree, pidfile=str(pidfile))
    assert sorted(job.scan(first=True)) == [400]
    tree.remove(400)
    tree.add(400, 1, ["postgres"], start=8000)  # PID recycled, pidfile left behind
    assert job.scan() == {}


def test_ambiguous_and_protected_selection(tree):
    tree.add(500, 1, ["python3", "train.py"])
    tree.add(501, 500, ["python3", "train.py"])  # same tree: not a second root
    tree.add(600, 1, ["python3", "train.py"])
    with pytest.raises(JobError, match="ambiguous") as raised:
        tracker(tree, cmdline_match=["train.py"]).scan(first=True)
    assert [candidate["pid"] for candidate in raised.value.candidates] == [500, 600]
    assert sorted(tracker(tree, cmdline_match=["train.py"], max_roots=2).scan(first=True)) == [500, 501, 600]
    with pytest.raises(JobError, match="ancestor of this module"):
        tracker(tree, cmdline_match=["sshd: root"]).scan(first=True)


def test_zombies_are_not_live_members(tree):
    tree.add(700, 1, ["python3", "train.py"], sid=700)
    tree.add(701, 700, ["python3", "loader"], sid=700, state="Z")
    assert sorted(tracker(tree, cmdline_match=["train.py"]).scan(first=True)) == [700]
