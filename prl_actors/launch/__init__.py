"""Launching a run: `up` (local processes, the fork server, docker compose), the one supervisor, and the
composition root (topology: which actor binds what, who talks to whom, how each is built)."""
