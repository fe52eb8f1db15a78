"""The agent runtime: preparing and finishing agent CLIs in sandboxes, installs, sessions, host services."""
