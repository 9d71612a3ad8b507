"""What the user sees of a study, each output read from the study's storage (see architecture.md)."""
