"""Test-only provider packages, installed into subprocesses by a directory on PYTHONPATH."""
