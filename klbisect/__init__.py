"""klbisect: find the commit that made a noisy accuracy metric worse."""
__version__ = "0.1.0"
