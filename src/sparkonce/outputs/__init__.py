from sparkonce.outputs.stable import BatchKey, StableOutput  # noqa: F401
