"""AgentUE: the message content model, validation, reducer and SSE framing. Pure; imports nothing of loopd."""
