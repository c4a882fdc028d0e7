"""Test equipment for the lab: compiled code for sources imported from zip archives, kept on disk.

Every Ansible module run ships its module_utils in a fresh AnsiballZ zip, and Python's zipimport compiles each source
anew (it never writes bytecode), for code that is the same in every run. The lab's hosts run thousands of module runs
per test suite on a 2-core machine, so that compilation was a large part of the suite's time. This module, loaded at
interpreter start by ``pivotlab_zipimport_cache.pth`` (on the controller, in tests only, by
``tests/support/controller_site/sitecustomize.py``), keeps each compiled source under ``CACHE_DIR``
(``$PIVOT_LAB_PYC_CACHE`` in tests), keyed by the interpreter's bytecode magic number, the source's path inside its
archive and the source's SHA-256, and hands zipimport the code object ``compile()`` would: its filenames are set to
this run's archive path, so tracebacks read as they would without the cache. Production hosts do not have it and do
not need it; nothing of Pivot depends on it.
"""

# Only modules every interpreter has loaded by the time site runs: this file is imported by every python3 on the host.
import marshal
import os
import zipimport
from importlib._bootstrap_external import MAGIC_NUMBER  # importlib.util would import more than it is worth here

CACHE_DIR = os.environ.get("PIVOT_LAB_PYC_CACHE", "/var/cache/pivot-lab-pyc")
_ARCHIVE_SUFFIX = ".zip" + os.sep
_CodeType = type(compile("", "", "exec"))
_compile_source = zipimport._compile_source  # the one function the cache stands in front of
# zipimport compiles each module twice in one import (for its spec's filename, then to run it): the second time is
# answered from memory, keyed by the source's full path (its code's filenames name this archive) and its disk entry.
_loaded: dict[str, _CodeType] = {}


def _with_filename(code: _CodeType, filename: str) -> _CodeType:
    constants = tuple(_with_filename(constant, filename) if isinstance(constant, _CodeType) else constant
                      for constant in code.co_consts)
    return code.replace(co_filename=filename, co_consts=constants)


def _cache_path(pathname: str, source: bytes) -> str:
    import hashlib  # noqa: PLC0415 - only once something is imported from a zip

    inside_archive = pathname.rpartition(_ARCHIVE_SUFFIX)[2]
    digest = hashlib.sha256(MAGIC_NUMBER + inside_archive.encode() + b"\0" + source).hexdigest()
    return os.path.join(CACHE_DIR, digest)


def _store(path: str, code: _CodeType) -> None:
    partial = f"{path}.{os.getpid()}"
    try:
        os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
        with open(partial, "wb") as handle:
            marshal.dump(code, handle)
        os.replace(partial, path)  # readers see a whole entry or none
    except OSError:  # a read-only or full disk only costs the compilation
        import contextlib  # noqa: PLC0415 - only after a failed write

        with contextlib.suppress(OSError):
            os.unlink(partial)


def _load(path: str, pathname: str) -> _CodeType | None:
    try:
        with open(path, "rb") as handle:
            code = marshal.loads(handle.read())  # one read: marshal.load reads a file in many small pieces
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return _with_filename(code, pathname) if isinstance(code, _CodeType) else None


def cached_compile_source(pathname: str, source: bytes) -> _CodeType:
    """zipimport's ``_compile_source``, through the cache."""
    path = _cache_path(pathname, source)
    key = pathname + "\0" + path
    code = _loaded.get(key)
    if code is None:
        code = _load(path, pathname)
        if code is None:
            code = _compile_source(pathname, source)
            _store(path, code)
        _loaded[key] = code
    return code


zipimport._compile_source = cached_compile_source
