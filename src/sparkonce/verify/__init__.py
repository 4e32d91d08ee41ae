"""Crash harness: named crash points, kill/restart, and oracle checks."""

from sparkonce.verify.driver import Driver

__all__ = ["Driver"]
