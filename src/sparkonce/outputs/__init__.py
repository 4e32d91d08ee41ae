"""Several named outputs of one pipeline, each bound for its own sink.

One import statement per module, re-exporting that module's public names.
"""

from sparkonce.outputs.combine import (  # noqa: F401
    OUTPUT_TAG,
    OutputLayout,
    check_output_mode,
    check_output_name,
    combine,
    select_output,
    split,
)
