"""The Arrow engine (``engine.ArrowEngine``) and the modules only it uses."""
