from sparkonce.outputs.quality import *  # noqa: F403 (re-exports quality.__all__)
