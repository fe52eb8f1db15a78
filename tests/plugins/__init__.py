"""Test-only plugin packages (a provider, a harness), installed into subprocesses by a
directory on PYTHONPATH."""
