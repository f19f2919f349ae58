-- What background work in a process without searches follows: the lowest share the search servers
-- published lately, the highest p99 among them, and how many published (none: full speed).
SELECT min(share), max(search_p99_ms), count(*)
FROM memstore_foreground
WHERE kind = 'search' AND updated_at > clock_timestamp() - make_interval(secs => %(fresh_s)s)
