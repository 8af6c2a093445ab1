"""Harness profiles: what Claude Code, Codex and the SDKs say in their own traffic."""
