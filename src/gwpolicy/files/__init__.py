"""Files: manifests in (YAML and JSON), documents out (effective policies, status, tables)."""
