"""loop-runtime: the operator toolkit (planned; empty today).

What operators will embed: a client of loop-server's HTTP API (the API, never the server's modules) and of the
Kubernetes-compatible API, through ``loopd.resources``' client (``loopd.resources.client``) and reconcile runtime
(``loopd.resources.reconcile``), which live there and are used as they are.

Must not import: loopd.server, loopd.harness, loopd.cli.
"""
