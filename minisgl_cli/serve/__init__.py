"""``minisgl serve``: the command (options, checks, start, signals); the HTTP API it starts is serving/api/."""
