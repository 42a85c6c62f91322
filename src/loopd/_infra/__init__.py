"""The infrastructure floor: shared plumbing every layer may use; imports nothing else of loopd."""
