"""loopd: durable, observable, permissioned collaboration between humans, operators and agent harnesses."""

__version__ = "0.1.0"
