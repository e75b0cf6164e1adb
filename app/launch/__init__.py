"""Launchers: what starts workers (and the service) where fleets already run them. Each renders or submits from
the same few facts (the served image pinned by digest, how many GPUs, where the service is, where the worker's
token is) and never puts a token on a command line."""
