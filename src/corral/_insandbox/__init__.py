"""Stdlib-only scripts that run inside sandboxes. They never import corral."""
