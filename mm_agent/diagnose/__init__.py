"""Log diagnosis: find the one root cause in training logs (engine arrives with issue 3)."""
