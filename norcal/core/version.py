"""The package version, owned by core so every layer can record it without importing the top package."""

__version__ = "0.1.0"
