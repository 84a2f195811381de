"""One object created, changed or deleted, applied to an analysis in place."""
