"""The worker's one part in webhooks: an outbox entry when a job with a `webhook` ends for good
(`shared.job_events`, which the producer's cancel of a waiting job uses too).

Appended before RQ records the outcome, so a worker killed in between leaves an event whose job
is not done yet: the dispatcher waits for the job to end (the reaper's retry, or its failure)
before it sends anything. Never a network call to a receiver from here.
"""

from __future__ import annotations

from shared.job_events import WebhookPolicy, job_ended, webhook_url

__all__ = ["WebhookPolicy", "job_ended", "webhook_url"]
