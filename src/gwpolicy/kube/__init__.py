"""The runtime every long-running process shares: API client, informers, leader election, endpoints, status writers, the process shell."""
