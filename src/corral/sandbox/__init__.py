"""Sandbox contracts and definitions (provider + workspace + policy + lifecycle)."""
