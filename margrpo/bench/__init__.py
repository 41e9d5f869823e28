"""Benchmark suites of margrpo (`margrpo bench <suite>`): each module has main(argv) and prints a table."""
