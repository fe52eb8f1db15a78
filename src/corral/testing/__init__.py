"""testkit."""
