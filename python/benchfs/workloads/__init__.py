"""Workloads that BenchFS runs against a cluster (each a module runnable under mpiexec)."""
