"""The validating admission webhook (GEP-713 discoverability): warnings at apply time, optional denials."""
