"""The journal: the agent's output on the host, written by the supervisor, read by offset."""
