"""A local Kubernetes API server for tests and for trying policies with kubectl and no cluster."""
