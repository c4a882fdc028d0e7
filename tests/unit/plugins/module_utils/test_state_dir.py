# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A host's state directory of a module's former name is adopted once, whole, and only for the module's default."""

from __future__ import annotations

import fcntl
import os

import pytest
from ansible_collections.pivot.ops.plugins.module_utils import state_dir
from ansible_collections.pivot.ops.plugins.module_utils.state_dir import adopt_former_state_dir, former_state_dir


def test_the_defaults_are_named_after_the_modules_and_their_former_names():
    assert state_dir.FORMER_STATE_DIRS == {
        "/var/lib/pivot/stop_training": "/var/lib/pivot/training_stop",
        "/var/lib/pivot/resume_training": "/var/lib/pivot/training_resume",
    }


@pytest.fixture
def root(tmp_path, monkeypatch):
    """STATE_ROOT in a temporary directory: the new name ``new`` for the former ``old``."""
    monkeypatch.setattr(state_dir, "FORMER_STATE_DIRS", {str(tmp_path / "new"): str(tmp_path / "old")})
    return tmp_path


# (what is on the host, the state_dir asked for, the directory to adopt)
CASES = {
    "only the former exists": ({"old"}, "new", "old"),
    "the new one exists already": ({"old", "new"}, "new", None),
    "only the new one exists": ({"new"}, "new", None),
    "neither exists (a first run)": (set(), "new", None),
    "a state_dir set by hand": ({"old"}, "custom", None),
    "the default written with a trailing slash": ({"old"}, "new/", "old"),
}


@pytest.mark.parametrize(("present", "asked", "adopted"), CASES.values(), ids=CASES.keys())
def test_which_directory_is_adopted(root, present, asked, adopted):
    for name in present:
        (root / name).mkdir()
    assert former_state_dir(str(root / asked)) == (str(root / adopted) if adopted else None)


def test_no_state_dir_adopts_nothing(root):
    (root / "old").mkdir()
    assert former_state_dir(None) is None and former_state_dir("") is None


def test_a_former_file_that_is_not_a_directory_is_left_alone(root):
    (root / "old").write_text("not a directory")
    assert former_state_dir(str(root / "new")) is None


def test_adopting_moves_the_whole_directory_and_a_held_lock_stays_held(root):
    old, new = root / "old", root / "new"
    (old / "records").mkdir(parents=True)
    (old / "records" / "20261130T153401Z-4242.json").write_text("{}")
    with open(old / "lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        adopt_former_state_dir(str(new), str(old))
        assert not old.exists()
        assert os.listdir(new / "records") == ["20261130T153401Z-4242.json"]
        with open(new / "lock") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
