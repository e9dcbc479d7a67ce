"""OpenAI compatibility: the request bodies' fields, a completion request's settings, the response
shapes, and Batch files (request lines in, response lines out), shared by serve and `openai-batch`."""
