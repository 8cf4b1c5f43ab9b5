"""The tests' and benches' shared harness, by concern."""
