"""The GitHub side of shardproof: parse (event, patch hunks), filter (where each finding goes),
report (review, sticky summary, commit status, check run, files). No analysis happens here."""
