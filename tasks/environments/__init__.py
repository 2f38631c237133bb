"""The environments an episode acts on: the sandbox where model-written code runs
(:mod:`tasks.environments.sandbox`, bubblewrap or docker), the browser for ``browser`` tasks
(:mod:`tasks.environments.browser`, MiniWoB++ in headless Chromium), and their exceptions
(:mod:`tasks.environments.errors`).

A layer of its own below both the freeze stage (``tasks.records``: the verifiers grade inside a
sandbox or a browser) and the rollout (``tasks.rollout``: the episode loop opens them). This file
imports nothing, so the harness tools can raise :mod:`tasks.environments.errors` without loading
a backend or the configuration.
"""
