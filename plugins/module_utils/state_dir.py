# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Where a module keeps its state on the host: ``/var/lib/pivot/<module>`` by default, named after the module (and so
after its role and phase). Until issue 16 the stop and resume modules were ``training_stop`` and ``training_resume``,
and so were their directories. A host that ran that Pivot keeps its state there (a stop's records that no run has
imported yet and its lock; the record by which a resume recognises the job it started) until the renamed module first
runs there and moves the directory, whole, to its new name in one rename. Only the defaults are moved: a state_dir set
by hand is used as it is."""

from __future__ import annotations

import os

STATE_ROOT = "/var/lib/pivot"
# module name -> the name it had before, for the modules whose state directory was renamed with them
FORMER_NAMES = {"stop_training": "training_stop", "resume_training": "training_resume"}
FORMER_STATE_DIRS = {os.path.join(STATE_ROOT, name): os.path.join(STATE_ROOT, former)
                     for name, former in FORMER_NAMES.items()}


def former_state_dir(state_dir: str | None) -> str | None:
    """The directory ``state_dir`` had under its module's former name, when that one is still to be adopted:
    ``state_dir`` is a renamed module's default, does not exist yet, and the former directory does. Otherwise None."""
    if not state_dir:
        return None
    former = FORMER_STATE_DIRS.get(os.path.normpath(state_dir))
    if former is None or os.path.lexists(state_dir) or not os.path.isdir(former):
        return None
    return former


def adopt_former_state_dir(state_dir: str, former: str) -> None:
    """Move ``former`` to ``state_dir`` in one rename (both lie in STATE_ROOT): records, lock and all. An open lock
    moves with its file, so a process that holds it keeps holding it."""
    os.rename(former, state_dir)
