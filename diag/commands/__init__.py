"""Every `diag` subcommand but `analyze` (in diag/cli.py, with the group): one module per command
family, imported only when its command runs (cli.LAZY_COMMANDS), so `diag analyze` never pays for
the dashboard's, the recommender's or the exporter's imports. Commands parse, call the library and
render; no analysis lives here."""
