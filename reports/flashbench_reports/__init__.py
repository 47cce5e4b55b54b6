"""flashbench_reports: HTML reports, noise-aware compare, bring-up comparison and history for flashbench
results files (Google Benchmark JSON shape + flashbench fields; see reports/SCHEMA.md)."""
__version__ = "0.1.0"
