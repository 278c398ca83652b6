"""Side-by-side benchmark of our person-level mean estimators and today's DP libraries (see README.md)."""
