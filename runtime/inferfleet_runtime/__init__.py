"""inferfleet serving runtime: paged and compiled engines behind one OpenAI-compatible server."""

import os

# OpenMP workers that busy-wait between parallel regions take the cores the event loop and other processes need;
# on a shared or small CPU that made every step several times slower with more than one torch thread. Sleeping
# workers let the engine use every core. libgomp reads this once, when torch loads it, so it is set here, before
# any module of the package imports torch; a value the user set wins (`OMP_WAIT_POLICY_IS_DEFAULT` says which:
# `bench compare` starts llama-server, which loads libgomp too, without this package's default).
OMP_WAIT_POLICY_IS_DEFAULT = "OMP_WAIT_POLICY" not in os.environ
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
