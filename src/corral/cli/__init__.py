"""The ``corral`` command line. Each command group lives in its own module."""
