"""The benchmark harness: ox against its published peers on the same database (issue 4)."""
