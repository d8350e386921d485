"""What only watches a run and writes its files: metrics and episode files, progress, health
warnings, the report, and secret redaction."""
