"""Operators (Router, LongHorizon), written with loop-runtime only."""
