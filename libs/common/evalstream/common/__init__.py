"""Shared contracts of the evalstream services: settings, topic names, messages, keys."""
