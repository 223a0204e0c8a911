"""Placeholder; implemented by the backend issue."""
