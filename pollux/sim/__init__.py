"""Trace-driven cluster simulator, using the same model and policy code as the services."""
