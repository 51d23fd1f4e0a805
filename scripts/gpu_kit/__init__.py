"""The GPU kit (run.sh, checks.py, wheelhouse.py; see run.sh). A package only so that the tests import its
Python parts as modules (`from scripts.gpu_kit import wheelhouse`)."""
