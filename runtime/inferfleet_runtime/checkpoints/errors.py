"""The error the checkpoint readers raise for a checkpoint they cannot load: one line naming the file and the field."""


class CheckpointError(ValueError):
    """A checkpoint's files are missing, malformed, incomplete or do not match its config."""
