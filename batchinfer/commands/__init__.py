"""The commands beside `run`: `plan` (dryrun, sample_timing), what `plan` and `status` print (show),
`export`, and `openai-batch -o`'s results file copied out (delivery)."""
