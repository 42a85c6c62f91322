"""Reusable test support: a throwaway PostgreSQL, an isolated kubectl runner, skip-or-fail-in-CI."""
