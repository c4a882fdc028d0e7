# Rewritten by lab/files/sglang-standin/build_wheels.py for each release it builds.
__version__ = "0.5.23"
