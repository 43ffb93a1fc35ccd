"""The SQL engine (``engine.SqlEngine``) and the modules only it uses."""
