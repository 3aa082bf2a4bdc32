"""`gateway bench`: latency benchmarking of this gateway or any server with the same protocol."""
