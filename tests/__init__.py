"""laminar test suite (a package so tests can share fixtures as tests.*)."""
