"""Build the lab's stand-in wheels (stdlib only, reproducible: fixed timestamps, sorted entries).

    python3 build_wheels.py OUT_DIR

- ``sglang-0.5.11-py3-none-any.whl``: the user's SGLang before the first pivot (no plugin system);
- ``sglang-0.5.23-py3-none-any.whl``: the release Pivot installs into its release venvs;
- ``pivot_lab_site-1.0-py3-none-any.whl``: a ``.pth`` that puts the lab's read-only Python packages (torch & co.,
  bind-mounted at /opt/pivot-lab/pylib) and the reference engine (/opt/pivot-lab/engine) on a venv's path, standing
  in for the torch and CUDA wheels a real release venv gets from the wheelhouse;
- ``pivot_labserver-<version>-py3-none-any.whl``: the lab's server (``../labserver``, name and version from its
  pyproject.toml), which the stand-in SGLang serves with. It declares no dependencies, as the stand-in declares none:
  the venvs it goes into get ddtree_runtime and torch otherwise (a release venv its ddtree_runtime from Pivot, every lab
  venv the rest through ``pivot_lab_site``).
"""

from __future__ import annotations

import base64
import hashlib
import sys
import tomllib
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LABSERVER = HERE.parent / "labserver"
SGLANG_RELEASES = {"0.5.11": False, "0.5.23": True}
"""Release -> whether it has SGLang's plugin system (``sglang.srt.plugins``, 0.5.12+)."""
LAB_SITE_PATHS = ("/opt/pivot-lab/pylib", "/opt/pivot-lab/engine")
EPOCH = (2026, 1, 1, 0, 0, 0)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(out_dir: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    info = f"{dist}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: pivot-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [_record_line(name, data) for name, data in sorted(files.items())] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = out_dir / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in sorted(files.items()):
            entry = zipfile.ZipInfo(name, date_time=EPOCH)
            entry.external_attr = 0o644 << 16
            wheel.writestr(entry, data, zipfile.ZIP_DEFLATED)
    return path


def sglang_files(version: str, has_plugins: bool) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for path in sorted((HERE / "sglang").rglob("*.py")):
        name = path.relative_to(HERE).as_posix()
        if not has_plugins and name.startswith("sglang/srt/plugins/"):
            continue
        files[name] = path.read_bytes()
    files["sglang/version.py"] = f'__version__ = "{version}"\n'.encode()
    return files


def package_files(root: Path, package: str) -> dict[str, bytes]:
    """Every ``.py`` file of ``root/package``, named as in a wheel."""
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted((root / package).rglob("*.py"))}


def build_labserver(out_dir: Path) -> Path:
    project = tomllib.loads((LABSERVER / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    return write_wheel(out_dir, name, version, package_files(LABSERVER, name))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    for version, has_plugins in SGLANG_RELEASES.items():
        print(write_wheel(out_dir, "sglang", version, sglang_files(version, has_plugins)))
    pth = ("\n".join(LAB_SITE_PATHS) + "\n").encode()
    print(write_wheel(out_dir, "pivot_lab_site", "1.0", {"pivot_lab_site.pth": pth}))
    print(build_labserver(out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
