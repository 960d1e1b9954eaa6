"""The read-only web dashboard every scheduler replica can serve (`dashboard_listen`).

`server.Dashboard` is the HTTP server; `protocol` parses requests, `routes` maps paths,
`views` shapes the JSON from the RPCs' answers and `sampler` keeps utilisation over time.
docs/architecture.md §5 ("Dashboard") describes it and its security model.
"""
