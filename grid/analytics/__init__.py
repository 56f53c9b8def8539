"""DuckDB analytics: a sink that follows the log, and the queries status and history use."""
