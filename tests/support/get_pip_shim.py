"""Offline stand-in for ansible-test's downloaded get-pip bootstrap script.

ansible-test downloads ``get-pip-<version>.py`` before creating its sanity-test venvs; this
machine cannot reach that host, so the venv's own ``ensurepip`` installs pip instead and any
requested packages then come from PyPI as usual.
"""

import ensurepip
import subprocess
import sys

ensurepip.bootstrap(upgrade=True)
requested = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
if requested:
    sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", "-q", *requested]))
