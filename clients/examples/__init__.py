"""Runnable examples of the Tenure client SDK."""
