"""The request core: what every transport's synthesis goes through (admission, the exchange
with a worker, keys and quotas, records), knowing no transport."""
