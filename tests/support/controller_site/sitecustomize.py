"""Test equipment: every Python the controller-side tests start loads the lab hosts' compile cache, and Ansible's
command-line processes do two things once that they otherwise repeat for every task (``pivot_ansible_speedups``).

Above all the controller's own module runs on localhost (the runs' locks, records and reports): like a lab host's, each
one compiles the ``module_utils`` of a fresh AnsiballZ zip anew, about 130 ms of CPU a run. ``tests/conftest.py`` puts
this directory on ``PYTHONPATH`` for the processes the tests start; a production controller never loads it. It stands in
for Debian's own ``sitecustomize`` in a ``/usr/bin/python3`` the tests start, which only installs apport's hook.
"""

import os
import sys

_LAB_FILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir, "lab", "files")
sys.path.insert(0, _LAB_FILES)
try:
    __import__("pivotlab_zipimport_cache")  # it patches zipimport as it is imported
except ImportError:  # a copy of the tests without lab/ only loses the cache
    pass
finally:
    sys.path.remove(_LAB_FILES)

if os.path.basename(sys.argv[0] if sys.argv else "").startswith("ansible"):
    import pivot_ansible_speedups

    pivot_ansible_speedups.install()
