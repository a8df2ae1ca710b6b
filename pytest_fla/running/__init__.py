"""Running the tests: where the numeric checks run (devices), Triton launches observed,
child processes and stalls, xdist workers and the GPU they share, a fleet of hosts."""
