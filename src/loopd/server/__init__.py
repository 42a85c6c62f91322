"""loop-server: conversations, messages, Task delivery, Harness Engine, Human Ask/Confirm, registry, ledger.

Must not import: loopd.operators, loopd.runtime, loopd.cli.
"""
