"""Test helpers for durable agents."""
