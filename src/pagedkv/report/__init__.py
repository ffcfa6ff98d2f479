"""Reports: tables (rich), JSON/CSV, plots, the HTML report. Reads results, never engine state."""
