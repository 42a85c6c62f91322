"""loop-runtime: the toolkit operators embed (a client of the server API plus the reconcile runtime).

Must not import: loopd.server, loopd.harness, loopd.cli.
"""
