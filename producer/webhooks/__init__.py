"""Webhook delivery: the dispatcher that reads the workers' outbox and calls receivers."""
