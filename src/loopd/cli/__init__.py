"""The composition root: `loopd` commands. May import every layer; nothing imports it."""

from loopd.cli._app import app, main

__all__ = ["app", "main"]
