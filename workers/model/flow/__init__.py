"""The flow: conformer encoder, flow-matching estimator, batched and incremental streaming forms."""
