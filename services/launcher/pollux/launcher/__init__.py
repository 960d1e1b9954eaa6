"""The NodeLauncher service: node registration and job replica processes."""
