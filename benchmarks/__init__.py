"""loopd benchmarks: run with `make bench` (never timed assertions in the test suite)."""
