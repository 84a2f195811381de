"""The `gwpolicy` command line (edge): argument parsing, loading, printing."""
