"""horovodliterun: the launcher (wraps mpirun)."""
