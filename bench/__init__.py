"""`make bench`: the performance report (run as `python -m bench.run`)."""
