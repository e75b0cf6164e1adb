"""Launchers: the jobs that run workers where fleets run them (`aiter-tuner launch ...`), rendered as text."""
