"""pytest plugin entry point (fixtures are added by the test-harness module)."""
