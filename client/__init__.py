"""Python client of the Pollux API and the pollux-cli command."""
