"""The controller (edge): informers on the API server, incremental analysis, status writes, leader election."""
