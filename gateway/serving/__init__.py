"""Serving and operating: the HTTP server (status pages, webhooks, the console's host), /healthz,
/readyz and /metrics, the Prometheus registry, the log's setup, the event loop's lag, who a
request comes from behind proxies, the limit on admin-token guesses, and text shown to deciders."""
